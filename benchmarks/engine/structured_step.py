"""What structured outputs cost a decode step (issue 36 target: batch 64, every row constrained by a JSON
schema, within 1.10x of unconstrained; unconstrained rows of a mixed batch within 1.02x).

    python benchmarks/engine/structured_step.py --json OUT.json     # GPU machine (carry .devshare)
    python benchmarks/engine/structured_step.py --smoke             # CPU, tiny model: checks the script

A Llama-3-8B shape with random bf16 weights and SmolLM2's tokenizer (`load_format="dummy"` over a folder of
config.json + .devshare/smollm2-tokenizer). 64 prompts of 32 random tokens, max_tokens 64, greedy, three
batches: none constrained, all constrained by a schema that cannot finish in 64 tokens (an array of 100
integers: every step of every row is masked), half constrained. Each is one `LLM.generate` after a warm-up
of the same shapes; the time a decode step = (generate time - the prefill step's) / decode steps.
Prints a table last; rows to --json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 100, "maxItems": 100}


def folder(smoke: bool) -> str:
    path = Path(tempfile.mkdtemp(prefix="rkv-structured-"))
    cfg = llama3_8b_config(smoke).to_dict()
    cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"] = 49152, 1, 2
    (path / "config.json").write_text(json.dumps(cfg))
    tok = REPO / ".devshare" / "smollm2-tokenizer"
    if not tok.is_dir():  # here: the packaged GGUF's converted folder has the same files
        from radixkv.engine.gguf import cached_hf_folder, smollm2_gguf_path
        tok = Path(cached_hf_folder(smollm2_gguf_path()))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, path / f)
    return str(path)


def run(llm: LLM, prompts: list[list[int]], constrained: list[bool], max_tokens: int, device: str) -> tuple[float, int]:
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                             structured_outputs={"json": SCHEMA} if c else None) for c in constrained]
    llm.reset_prefix_cache()
    steps0 = llm.core.num_steps
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    if device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t
    assert all(len(o.token_ids) == max_tokens for o in outs)
    for o, c in zip(outs, constrained):
        if c:
            assert o.outputs[0].text.startswith("["), o.outputs[0].text[:40]
    return secs, llm.core.num_steps - steps0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true", help="cProfile of the all-constrained run (host time)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, n = (4, 12) if a.smoke else (a.rows, a.max_tokens)
    llm = LLM(folder(a.smoke), load_format="dummy", dtype="bfloat16" if device == "cuda" else "float32",
              device=device, **({"num_pages": 64} if a.smoke else {}))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 49152, (32,), generator=g).tolist() for _ in range(rows)]
    cases = {"none": [False] * rows, "all": [True] * rows, "half": [i % 2 == 0 for i in range(rows)]}
    out = []
    base = None
    for name, constrained in cases.items():
        run(llm, prompts, constrained, n, device)  # warm-up: the same shapes
        secs, steps = run(llm, prompts, constrained, n, device)
        per_step = secs / steps * 1e3
        base = per_step if name == "none" else base
        out.append({"constrained": name, "rows": rows, "max_tokens": n, "seconds": round(secs, 4), "steps": steps,
                    "ms_per_step": round(per_step, 3), "vs_none": round(per_step / base, 3),
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
    if a.profile:  # where the host's time goes when every row is constrained
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(run, llm, prompts, cases["all"], n, device)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"\n{'constrained':>11} {'rows':>5} {'steps':>6} {'ms/step':>8} {'vs none':>8}")
    for r in out:
        print(f"{r['constrained']:>11} {r['rows']:>5} {r['steps']:>6} {r['ms_per_step']:>8.2f} {r['vs_none']:>8.3f}")


if __name__ == "__main__":
    main()
