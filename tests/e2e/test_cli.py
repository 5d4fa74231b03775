"""The `radixkv` command end to end: replay (bundled sample and full trace, JSON, plot, malformed
input), gen, the engine commands, real-mode replay on a tiny random model, --version, and the
front door: every ordinary mistake is one `radixkv: error:` line with exit status 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from radixkv.cli import main

TINY_LLAMA = {"model_type": "llama", "vocab_size": 160, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2}
DESIGN_KEYS = {"requests", "completed", "prompt_tokens", "hit_tokens", "hit_rate", "peak_pages", "preemptions",
               "wait_p50_s", "wait_p99_s", "wait_max_s", "leaked_pages", "wall_s"}


def test_replay_without_arguments_runs_bundled_sample():
    """The fresh-install path: a real subprocess, no TRACE, simulated through the scheduler."""
    out = subprocess.run([sys.executable, "-m", "radixkv.cli", "replay"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mooncake_sample.jsonl (mooncake)" in out.stdout and "mode" in out.stdout
    assert "300 (300 completed" in out.stdout
    rate = float(next(l for l in out.stdout.splitlines() if l.startswith("prefix hit rate")).split()[-1])
    assert 0.5 < rate < 0.7


def test_replay_sequential_json_plot(tmp_path, capsys):
    assert main(["gen", "shared-prefix", "-o", str(tmp_path / "sp.jsonl"), "--groups", "2", "--prompts", "5",
                 "--system-len", "64", "--question-len", "16"]) == 0
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["replay", str(tmp_path / "sp.jsonl"), "--simulate", "--sequential", "--json", str(js),
                 "--plot", str(png)]) == 0
    stdout = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert DESIGN_KEYS <= d.keys()
    # 10 prompts of 80 tokens; each group's 64-token system prompt is computed once
    assert (d["requests"], d["completed"], d["prompt_tokens"], d["hit_tokens"]) == (10, 10, 800, 8 * 64)
    assert d["hit_rate"] == pytest.approx(0.64) and d["leaked_pages"] == 0 and d["mode"] == "sequential"
    assert "prefix hit rate             0.6400" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_capped_pool_and_policies(tmp_path):
    trace = tmp_path / "mt.jsonl"
    assert main(["gen", "multi-turn", "-o", str(trace), "--sessions", "4", "--turns", "3", "--max-tokens", "16"]) == 0
    results = {}
    for extra in (["--sequential"], ["--policy", "fcfs", "--burst"], ["--policy", "lpm", "--concurrency", "4"],
                  ["--policy", "dfs-weight"]):
        js = tmp_path / "out.json"
        assert main(["replay", str(trace), "--num-pages", "400", "--page-size", "8", "--json", str(js)] + extra) == 0
        d = json.loads(js.read_text())
        assert d["completed"] == d["requests"] == 12 and d["leaked_pages"] == 0 and d["peak_pages"] <= 400
        results[tuple(extra)] = d["hit_rate"]
    assert all(0.0 < h < 1.0 for h in results.values())


def test_replay_malformed_trace_names_line_and_skip_bad(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'
                     '{"timestamp": 5, "input_length": 600, "output_length": 2}\n'
                     '{"timestamp": 9, "input_length": 512, "output_length": 2, "hash_ids": [0]}\n')
    assert main(["replay", str(trace), "--sequential"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2: line 2, field 'hash_ids': missing" in err
    js = tmp_path / "r.json"
    assert main(["replay", str(trace), "--sequential", "--skip-bad", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert (d["requests"], d["skipped"], d["hit_tokens"]) == (2, 1, 512)


def test_replay_format_override_and_missing_file(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "text": "hello world", "max_tokens": 2}\n'
                     '{"arrival_s": 1, "text": "hello world again", "max_tokens": 2}\n')
    assert main(["replay", str(trace), "--format", "radixkv", "--sequential", "--page-size", "1"]) == 0
    assert "prefix hit rate             0.3929" in capsys.readouterr().out  # 11 of 28 bytes
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "trace not found" in capsys.readouterr().err
    assert main(["replay", str(trace), "--format", "mooncake"]) == 2
    assert "t.jsonl:1: line 1, field 'hash_ids'" in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal_and_record(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "fs.jsonl"
    assert main(["gen", "few-shot", "-o", str(trace), "--templates", "2", "--prompts", "3"]) == 0
    capsys.readouterr()
    assert main(["replay", str(trace), "--sequential"]) == 0
    assert "req" not in capsys.readouterr().err  # captured stderr is not a terminal: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rec = tmp_path / "rec.jsonl"
    assert main(["replay", str(trace), "--sequential", "--record", str(rec)]) == 0
    assert "6/6" in capsys.readouterr().err  # tqdm's final count
    assert main(["replay", str(trace), "--sequential", "--no-progress"]) == 0
    assert "6/6" not in capsys.readouterr().err
    assert rec.read_text() == trace.read_text()  # the replayed requests, as radixkv JSONL


@pytest.mark.parametrize("kind", ["multi-turn", "few-shot", "shared-prefix"])
def test_gen_writes_loadable_trace(tmp_path, kind, capsys):
    out = tmp_path / f"{kind}.jsonl"
    assert main(["gen", kind, "-o", str(out), "--seed", "3"]) == 0
    assert "wrote" in capsys.readouterr().out
    first = json.loads(out.read_text().splitlines()[0])
    assert {"arrival_s", "tokens", "max_tokens", "session"} <= first.keys()


@pytest.mark.parametrize("kind", ["multi-turn", "few-shot", "shared-prefix"])
def test_gen_refuses_a_nan_rate_in_one_line_and_writes_nothing(tmp_path, kind, capsys):
    """`--rate nan` used to write "arrival_s": NaN, which replay then refuses (issue 16, defect 8)."""
    out = tmp_path / "t.jsonl"
    for rate, needle in (("nan", "rate must be > 0"), ("-2", "rate must be > 0"), ("0", "rate must be > 0")):
        code, stdout, err = _run(["gen", kind, "-o", str(out), "--rate", rate], capsys)
        assert code == 2 and stdout == "" and not out.exists()
        assert needle in _one_error_line(err) and rate in err
    code, stdout, err = _run(["gen", kind, "-o", str(tmp_path), "--rate", "inf"], capsys)  # -o a folder
    assert code == 2 and "cannot write the trace" in _one_error_line(err)


def test_help_and_engine_commands(capsys):
    for argv in (["--help"], ["replay", "--help"], ["gen", "--help"], ["generate", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert "--sequential" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["replay", "--num-pages", "0"])
    assert "positive integer" in capsys.readouterr().err


def test_bench_serves_few_shot_prompts_from_the_cache(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--shots", "2", "--prompts", "2", "--max-tokens", "2", "--hidden", "64", "--layers", "1",
            "--device", "cpu", "--json", str(out)]
    assert main(argv) == 0
    assert "identical across modes: True" in capsys.readouterr().out
    off, on, batched = json.loads(out.read_text())
    assert off["hit_rate"] == 0.0 and off["cached_tokens"] == 0
    assert on["hit_rate"] > 0.3 and batched["cached_tokens"] == on["cached_tokens"] > 0
    assert on["prompt_tokens"] == off["prompt_tokens"] == on["cached_tokens"] + on["computed_tokens"]


def test_replay_real_mode_on_tiny_random_model(tmp_path, capsys):
    pytest.importorskip("torch")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 160, "hidden_size": 32,
                               "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                               "num_key_value_heads": 1, "max_position_embeddings": 256}))
    trace = tmp_path / "sp.jsonl"
    assert main(["gen", "shared-prefix", "-o", str(trace), "--groups", "1", "--prompts", "3",
                 "--system-len", "32", "--question-len", "8", "--max-tokens", "2"]) == 0
    js = tmp_path / "real.json"
    assert main(["replay", str(trace), "--model", str(cfg), "--sequential", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["mode"] == "real" and d["completed"] == 3 and d["leaked_pages"] == 0
    assert d["hit_tokens"] == 2 * 32  # the 2nd and 3rd prompts reuse the shared 32-token prefix
    assert main(["replay", str(trace), "--model", str(cfg), "--burst", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert (d["completed"], d["leaked_pages"], d["prompt_tokens"]) == (3, 0, 3 * 40)
    assert main(["replay", str(trace), "--model", str(cfg), "--simulate"]) == 2
    assert "exclude each other" in capsys.readouterr().err

    assert main(["generate", str(cfg), "5,6,7,8", "5,6,7,9", "--max-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("(3 tokens" in line for line in lines)
    assert main(["generate", str(cfg), "hello"]) == 2
    assert "no tokenizer" in capsys.readouterr().err
    assert main(["generate", str(cfg), "5,999"]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err


def _mooncake_records(n: int, seed: int) -> list[dict]:
    """A Mooncake-shaped trace: prompts continue earlier ones (shared leading ids), partial last
    blocks, fresh ids, some ids beyond int32 tokens (renumbered by the reader), output_length 0."""
    import random

    rng = random.Random(seed)
    recs: list[dict] = []
    fresh = iter(range(10**12, 10**13))
    for i in range(n):
        ids = list(rng.choice(recs)["hash_ids"][: rng.randint(1, 4)]) if recs and rng.random() < 0.7 else []
        ids += [next(fresh) if rng.random() < 0.5 else rng.randint(0, 40) for _ in range(rng.randint(1, 3))]
        length = (len(ids) - 1) * 512 + rng.randint(1, 512)
        recs.append({"timestamp": 100 * i, "input_length": length, "output_length": rng.randint(0, 4),
                     "hash_ids": ids})
    return recs


def _page_keys(rec: dict, ps: int) -> list[tuple]:
    """Keys of a request's full pages, from its hash ids alone: (prefix of block ids, page in block)."""
    per = 512 // ps
    return [(tuple(rec["hash_ids"][: j // per + 1]), j % per) for j in range(rec["input_length"] // ps)]


def _count_hits(recs: list[dict], ps: int, capacity: int | None) -> float:
    """Independent hit rate: leading pages already cached; LRU over full pages when capacity is set."""
    from collections import OrderedDict

    cache: OrderedDict[tuple, None] = OrderedDict()
    hit = total = 0
    for rec in recs:
        keys = _page_keys(rec, ps)
        k = 0
        while k < len(keys) and keys[k] in cache:
            k += 1
        hit, total = hit + k * ps, total + rec["input_length"]
        for key in reversed(keys):  # deepest first, so a prefix outlives its extensions (as vLLM frees)
            cache[key] = None
            cache.move_to_end(key)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return hit / total


def test_replay_mooncake_hit_rates_match_an_independent_count(tmp_path):
    """Counted from hash ids, not from our token expansion: exact with an unlimited pool, and an
    LRU-capped pool within 0.02 of a plain LRU over pages."""
    recs = _mooncake_records(150, seed=11)
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    js = tmp_path / "r.json"
    for ps, pages in ((16, None), (16, 300), (64, 80)):
        extra = [] if pages is None else ["--num-pages", str(pages)]
        assert main(["replay", str(trace), "--simulate", "--sequential", "--page-size", str(ps),
                     "--json", str(js), *extra]) == 0
        d = json.loads(js.read_text())
        want = _count_hits(recs, ps, pages)
        assert DESIGN_KEYS <= d.keys() and d["requests"] == d["completed"] == len(recs)
        assert d["leaked_pages"] == 0 and d["prompt_tokens"] == sum(r["input_length"] for r in recs)
        if pages is None:
            assert round(d["hit_rate"], 4) == round(want, 4) and d["hit_rate"] == pytest.approx(want, abs=1e-12)
        else:
            assert abs(d["hit_rate"] - want) < 0.02 and d["peak_pages"] <= pages


def test_python_dash_m_radixkv_is_the_command(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [7]}\n'
                     '{"timestamp": 1, "input_length": 40, "output_length": 1, "hash_ids": [7]}\n')
    out = subprocess.run([sys.executable, "-m", "radixkv", "replay", str(trace), "--sequential"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "prefix hit rate             0.4000" in out.stdout  # 32 of 80 tokens (two full pages of 16)


# ---------------------------------------------------------------- the front door


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """main(argv) in this process: (exit status, stdout, stderr), argparse's SystemExit included."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixkv: error: "), err
    assert "Traceback" not in err and "usage:" not in err
    return lines[0]


def test_version():
    out = subprocess.run([sys.executable, "-m", "radixkv", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == ""
    name, version = out.stdout.split()
    assert name == "radixkv" and version[0].isdigit()


@pytest.fixture
def models(tmp_path):
    """A tiny Llama config.json, a tiny GPT-2 config.json, a folder holding it, an empty folder."""
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps(TINY_LLAMA))
    gpt2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64, "n_positions": 64,
            "bos_token_id": 0, "eos_token_id": 0}
    (tmp_path / "gpt2.json").write_text(json.dumps(gpt2))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(gpt2))
    (tmp_path / "empty").mkdir()
    return tmp_path


@pytest.mark.parametrize("argv, needle", [
    (["generate", "{d}/llama.json", "1,2", "--kv-dtype", "int8"], "argument --kv-dtype: invalid choice: 'int8'"),
    (["generate", "{d}/llama.json", "1,2", "--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
    (["replay", "--num-pages", "0"], "argument --num-pages: expected a positive integer"),
    (["replay", "--policy", "random"], "argument --policy: invalid choice"),
    (["replay", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "required: COMMAND"),
    (["replay", "{d}/missing.jsonl"], "trace not found"),
    (["replay", "{d}/bad.jsonl"], "bad.jsonl:2: line 2, field 'hash_ids'"),
    (["replay", "{d}/empty", "--format", "mooncake"], "cannot read the trace"),
    (["replay", "--device", "cpu"], "--device needs --model"),
])
def test_usage_and_input_mistakes_are_one_line(argv, needle, models, capsys):
    (models / "bad.jsonl").write_text('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'
                                      '{"timestamp": 5, "input_length": 600, "output_length": 2}\n')
    code, out, err = _run([a.format(d=models) for a in argv], capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


@pytest.mark.parametrize("model, needle", [("gpt2.json", "gpt2"), ("gpt2", "gpt2"), ("empty", "config.json"),
                                           ("nowhere", "nowhere")])
def test_models_the_engine_refuses_are_one_line(model, needle, models, capsys):
    pytest.importorskip("torch")
    for argv in (["generate", str(models / model), "1,2"], ["replay", "--model", str(models / model)]):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == ""
        assert needle in _one_error_line(err)


def test_cuda_on_a_cpu_build_is_one_line(models, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch build has CUDA")
    code, _, err = _run(["generate", str(models / "llama.json"), "1,2", "--device", "cuda"], capsys)
    assert code == 2 and "cuda" in _one_error_line(err)


def test_errors_from_a_real_process_have_no_traceback(tmp_path):
    for argv, needle in ((["replay", str(tmp_path / "nope.jsonl")], "trace not found"),
                         (["generate", "x.json", "hi", "--kv-dtype", "int8"], "invalid choice")):
        out = subprocess.run([sys.executable, "-m", "radixkv", *argv], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stdout == ""
        assert needle in _one_error_line(out.stderr)


def test_stdout_closed_early_exits_quietly():
    """`radixkv replay | head -1`: the reader is gone before the summary is written."""
    p = subprocess.Popen([sys.executable, "-m", "radixkv", "replay", "--sequential"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=60) == 141 and err == ""
    shell = subprocess.run(f"{sys.executable} -m radixkv replay --sequential | head -1", shell=True,
                           capture_output=True, text=True, timeout=60)
    assert shell.stdout.startswith("trace ") and "Traceback" not in shell.stderr


def test_bundled_full_trace_by_name(tmp_path, monkeypatch, capsys):
    """README's full-trace command, from a folder with no ../shared: 0.6512 at page 16."""
    monkeypatch.chdir(tmp_path)
    js = tmp_path / "full.json"
    assert main(["replay", "mooncake-synthetic", "--sequential", "--json", "full.json"]) == 0
    assert "mooncake_synthetic_trace.jsonl (mooncake)" in capsys.readouterr().out
    d = json.loads(js.read_text())
    assert (d["requests"], d["completed"], d["leaked_pages"], round(d["hit_rate"], 4)) == (3993, 3993, 0, 0.6512)
    assert d["prompt_tokens"] == 61_194_628
    # a file of that name in the current folder takes precedence over the bundled trace
    (tmp_path / "mooncake-synthetic").write_text('{"timestamp": 0, "input_length": 40, "output_length": 1, '
                                                 '"hash_ids": [7]}\n')
    assert main(["replay", "mooncake-synthetic", "--sequential", "--json", "full.json"]) == 0
    assert json.loads(js.read_text())["requests"] == 1
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    assert "mooncake-synthetic" in capsys.readouterr().out


def test_replay_nothing_completed_exits_1(tmp_path, capsys):
    trace = tmp_path / "big.jsonl"
    trace.write_text('{"arrival_s": 0, "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 1}\n')
    for extra in (["--sequential"], []):
        code, out, err = _run(["replay", str(trace), "--num-pages", "1", "--page-size", "4", *extra], capsys)
        assert code == 1 and "0 completed, 1 too large for the pool" in out
        assert "no request completed of 1: 1 too large for the pool" in _one_error_line(err)


def test_real_replay_counts_requests_longer_than_the_context(tmp_path, capsys):
    pytest.importorskip("torch")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 64}))
    trace = tmp_path / "mixed.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0, "tokens": list(range(n)), "max_tokens": 2}) + "\n"
                             for n in (40, 100, 40, 63)))  # 102 and 65 tokens exceed the 64-token context
    js = tmp_path / "real.json"
    assert main(["replay", str(trace), "--model", str(cfg), "--burst", "--json", str(js)]) == 0
    assert "2 longer than the model's context of 64 tokens" in capsys.readouterr().out
    d = json.loads(js.read_text())
    assert DESIGN_KEYS <= d.keys()
    assert (d["requests"], d["completed"], d["too_long"], d["rejected"], d["model_context"]) == (4, 2, 2, 0, 64)
    assert (d["prompt_tokens"], d["hit_tokens"], d["leaked_pages"]) == (80, 32, 0)

    trace.write_text(json.dumps({"arrival_s": 0, "tokens": list(range(100)), "max_tokens": 2}) + "\n")
    code, out, err = _run(["replay", str(trace), "--model", str(cfg), "--sequential", "--json", str(js)], capsys)
    assert code == 1 and "0 completed" in out
    assert "1 longer than the model's context of 64 tokens" in _one_error_line(err)
    assert json.loads(js.read_text())["too_long"] == 1
