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
    (["replay", "{d}/empty", "--format", "mooncake"], "empty: is a folder, not a JSONL trace file"),
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



# ---------------------------------------------------------------- bad input: one line, never a traceback (issue 16)


def _good_line() -> str:
    return json.dumps({"arrival_s": 0, "text": "hello", "max_tokens": 1}) + "\n"


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)  # the same bytes in every worker that collects it


@pytest.mark.parametrize("data, needle", [
    ('{"arrival_s": 0, "text": "caf\xe9", "max_tokens": 1}\n'.encode("latin-1"),
     "t.jsonl:1: line 1, field '<text>': not UTF-8 text (byte 0xe9 at column 30)"),
    (bytes(range(256)) * 4, "t.jsonl: is binary (a NUL byte at offset 0), not a JSON text trace"),
    (b"\x80\x81\xfe\xff garbage\n", "t.jsonl:1: line 1, field '<text>': not UTF-8 text (byte 0x80 at column 1)"),
    (_gzip(_good_line().encode()), "t.jsonl: is gzip-compressed (decompress it first: gunzip -k"),
    (b"BZh91AY&SY" + bytes(32), "t.jsonl: is bzip2-compressed"),
])
@pytest.mark.parametrize("extra", [[], ["--skip-bad"], ["--format", "radixkv"], ["--format", "mooncake"]])
def test_trace_that_is_not_utf8_text_is_one_line(tmp_path, capsys, data, needle, extra):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(data)
    code, out, err = _run(["replay", str(trace), *extra], capsys)
    line = _one_error_line(err)
    assert code == 2 and out == ""
    if b"arrival_s" in data and "--skip-bad" in extra:  # a line not UTF-8 is a skippable record
        assert "no valid records remain: its only record was malformed and skipped (--skip-bad)" in line
    assert needle in line


def test_skip_bad_skips_a_line_that_is_not_utf8(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_good_line().encode() + b'{"text": "caf\xe9"}\n' + _good_line().encode())
    js = tmp_path / "r.json"
    assert main(["replay", str(trace), "--sequential", "--skip-bad", "--json", str(js)]) == 0
    assert (json.loads(js.read_text())["requests"], json.loads(js.read_text())["skipped"]) == (2, 1)
    code, _, err = _run(["replay", str(trace)], capsys)
    assert code == 2 and "t.jsonl:2: line 2, field '<text>': not UTF-8 text" in _one_error_line(err)


@pytest.mark.parametrize("fmt", ["radixkv", "mooncake"])
def test_a_folder_given_as_a_jsonl_trace_is_one_line(tmp_path, capsys, fmt):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(_good_line())
    code, out, err = _run(["replay", str(tmp_path / "d"), "--format", fmt], capsys)
    assert code == 2 and out == ""
    assert "d: is a folder, not a JSONL trace file (only a WEKA trace may be a folder" in _one_error_line(err)
    code, _, err = _run(["replay", str(tmp_path / "d")], capsys)  # auto: a folder is WEKA's
    assert code == 2 and "d: no *.json files in this folder" in _one_error_line(err)


ABSURD = 2**40


@pytest.mark.parametrize("record, needle", [
    ({"timestamp": 0, "input_length": 2**31, "output_length": 1, "hash_ids": []},
     "line 1, field 'input_length': 2,147,483,648 tokens is absurd: at most 16,777,216"),
    ({"timestamp": 0, "input_length": ABSURD, "output_length": 1, "hash_ids": [1]},
     "line 1, field 'input_length': 1,099,511,627,776 tokens is absurd"),
    ({"timestamp": 0, "input_length": 10, "output_length": 2**31 - 1, "hash_ids": [1]},
     "line 1, field 'output_length': 2,147,483,647 tokens is absurd"),
    ({"timestamp": 0, "input_length": 10, "output_length": 10**400, "hash_ids": [1]},
     "line 1, field 'output_length': a 401-digit integer tokens is absurd"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1e300, "hash_ids": [1]},
     "line 1, field 'output_length': expected an integer, got 1e+300"),
    ({"arrival_s": 0, "tokens": [1, 2], "max_tokens": ABSURD}, "line 1, field 'max_tokens': 1,099,511,627,776 tokens"),
    ({"arrival_s": 0, "tokens": [1, 2], "max_tokens": -ABSURD}, "line 1, field 'max_tokens': must be >= 1"),
])
def test_absurd_lengths_are_refused_naming_line_and_field(tmp_path, capsys, record, needle):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(record) + "\n")
    code, out, err = _run(["replay", str(trace)], capsys)
    assert code == 2 and out == ""
    assert f"t.jsonl:1: {needle}" in _one_error_line(err)
    code, _, err = _run(["replay", str(trace), "--skip-bad"], capsys)  # the record is skipped, and said so
    assert code == 2 and "its only record was malformed" in _one_error_line(err) and needle in err


def test_absurd_weka_lengths_and_pools_beyond_int32(tmp_path, capsys):
    conv = {"id": "c", "block_size": 2**20, "requests": [{"t": i, "in": 2**24, "out": 1, "hash_ids": list(range(16))}
                                                          for i in range(128)]}
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps(conv))
    # every request fits, but an unlimited pool of 1-token pages would need more than 2**31 - 1 pages
    code, out, err = _run(["replay", str(trace), "--page-size", "1"], capsys)
    assert code == 2 and out == ""
    assert "big.json: an unlimited pool for these 128 requests needs 2,147,483,777 pages of 1 tokens, more than " \
           "a pool holds (2,147,483,647); give --num-pages" in _one_error_line(err)
    code, out, _ = _run(["replay", str(trace), "--num-pages", "100", "--page-size", "1"], capsys)
    assert code == 1 and "0 completed, 128 too large for the pool" in out  # bigger than the pool: counted
    trace.write_text(json.dumps({**conv, "block_size": ABSURD}))
    code, _, err = _run(["replay", str(trace)], capsys)
    assert code == 2 and "big.json: field 'block_size': 1,099,511,627,776 tokens is absurd" in _one_error_line(err)
    conv["requests"][0]["in"] = 2**31
    trace.write_text(json.dumps(conv))
    code, _, err = _run(["replay", str(trace)], capsys)
    assert code == 2 and "big.json:1: request 1, field 'in': 2,147,483,648 tokens is absurd" in _one_error_line(err)


def test_more_distinct_content_than_int32_tokens_is_one_line(tmp_path, capsys):
    """300 prompts of 2**24 tokens, none shared: 5e9 tokens of different content cannot be int32 tokens."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 2**24, "output_length": 1, "hash_ids": []})
                             + "\n" for i in range(300)))
    code, _, err = _run(["replay", str(trace)], capsys)
    assert code == 2 and "t.jsonl: 9,830,400 distinct 512-token blocks" in _one_error_line(err)


@pytest.mark.parametrize("argv, needle", [
    (["replay", "--num-pages", str(2**31)], "argument --num-pages: expected at most 2,147,483,647 pages"),
    (["replay", "--num-pages", str(ABSURD)], "argument --num-pages: expected at most 2,147,483,647 pages"),
    (["replay", "--num-pages", "0"], "argument --num-pages: expected a positive integer, got 0"),
    (["replay", "--num-pages", "-1"], "argument --num-pages: expected a positive integer, got -1"),
    (["replay", "--num-pages", "1e3"], "argument --num-pages: expected a positive integer, got '1e3'"),
    (["bench", "--num-pages", str(2**31)], "argument --num-pages: expected at most 2,147,483,647 pages"),
    (["bench", "--num-pages", "0"], "argument --num-pages: expected a positive integer, got 0"),
])
def test_num_pages_outside_int32_page_ids_is_one_line(argv, needle, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


@pytest.mark.parametrize("flag, name, needle", [
    ("--json", "outdir", "--json {d}/outdir: is a folder; give a file name"),
    ("--plot", "outdir", "--plot {d}/outdir: is a folder; give a file name"),
    ("--record", "outdir", "--record {d}/outdir: is a folder; give a file name"),
    ("--json", "missing/r.json", "--json {d}/missing/r.json: folder '{d}/missing' does not exist"),
    ("--plot", "r.xyz", "--plot {d}/r.xyz: cannot draw '.xyz' images; use one of"),
])
def test_output_paths_that_cannot_be_written_are_refused_before_the_replay(tmp_path, capsys, flag, name, needle):
    (tmp_path / "outdir").mkdir()
    trace = tmp_path / "t.jsonl"
    trace.write_text(_good_line())
    code, out, err = _run(["replay", str(trace), flag, str(tmp_path / name)], capsys)
    assert code == 2 and out == ""  # nothing replayed, no summary
    assert needle.format(d=tmp_path) in _one_error_line(err)
    assert list((tmp_path / "outdir").iterdir()) == [] and not (tmp_path / "outdir.png").exists()


def test_bench_json_at_a_folder_is_refused_before_the_bench(tmp_path, capsys):
    code, out, err = _run(["bench", "--device", "cpu", "--json", str(tmp_path)], capsys)
    assert code == 2 and out == "" and "is a folder; give a file name" in _one_error_line(err)


# ---------------------------------------------------------------- defect 10: messages in the user's terms


@pytest.mark.parametrize("text, extra, needle", [
    ("null\n" + _good_line(), [], "t.jsonl:1: line 1, field '<record>': the record is null, not a JSON object"),
    (_good_line() + "null\n", [], "t.jsonl:2: line 2, field '<record>': the record is null, not a JSON object"),
    (_good_line() + "[1, 2]\n", [], "t.jsonl:2: line 2, field '<record>': the record is an array, not a JSON object"),
    ("null\n", [], "t.jsonl:1: line 1, field '<record>': the record is null, not a JSON object"),
    ("null\n", ["--format", "radixkv", "--skip-bad"],
     "its only record was malformed and skipped (--skip-bad); the error: {t}:1: line 1, field '<record>': the record "
     "is null"),
    ("", [], "t.jsonl: the file is empty (no records)"),
    ("", ["--format", "mooncake"], "t.jsonl: the file is empty (no records)"),
    ("\n  \n\n", [], "t.jsonl: the file holds only blank lines (no records)"),
    ('{"timestamp": 0, "input_length": 10, "output\n' + json.dumps({"timestamp": 1, "input_length": 10,
                                                                    "output_length": 1, "hash_ids": [1]}) + "\n",
     [], "t.jsonl:1: line 1, field '<json>': not valid JSON"),  # a broken first line does not hide the format
    ('{"arrival_s": 0, "max_tokens": 1}\n{"x": 1}\n', ["--skip-bad"],
     "t.jsonl: no valid records remain: all 2 records were malformed and skipped (--skip-bad); the first: "
     "{t}:1: line 1, field 'tokens': missing"),
    ('{"foo": 1}\n', [], "t.jsonl:1: line 1, field '<record>': cannot detect the format"),
    ("1" * 5000 + "\n", ["--format", "radixkv"], "t.jsonl:1: line 1, field '<json>': not valid JSON (Exceeds the "
                                                  "limit (4300 digits) for integer string conversion"),
    ("[" * 100_000 + "\n", ["--format", "radixkv"], "t.jsonl:1: line 1, field '<json>': not valid JSON (nested too "
                                                     "deeply)"),
])
def test_trace_messages_say_what_is_wrong(tmp_path, capsys, text, extra, needle):
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    code, out, err = _run(["replay", str(trace), *extra], capsys)
    assert code == 2 and out == ""
    assert needle.format(t=trace) in _one_error_line(err)


@pytest.mark.parametrize("doc, extra, needle", [
    ({"id": "c", "block_size": 64}, [], "w.json: field 'requests': missing (a WEKA conversation lists its requests"),
    ({"id": "c", "block_size": 64}, ["--format", "weka"], "w.json: field 'requests': missing"),
    ({"id": "c", "requests": {"t": 0}}, [], "w.json: field 'requests': expected a list of requests, got dict"),
    ([1, 2], ["--format", "weka"], "w.json: field '<record>': the document is an array, not a JSON object"),
])
@pytest.mark.parametrize("indent", [None, 2])
def test_weka_document_without_requests_names_the_key(tmp_path, capsys, doc, extra, needle, indent):
    trace = tmp_path / "w.json"
    trace.write_text(json.dumps(doc, indent=indent))
    code, out, err = _run(["replay", str(trace), *extra], capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


def test_skip_bad_reports_the_count(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(_good_line() + "null\n{not json\n" + _good_line())
    code, out, _ = _run(["replay", str(trace), "--sequential", "--skip-bad"], capsys)
    assert code == 0 and "2 (2 completed, 0 too large for the pool, 2 malformed skipped)" in out


# ---------------------------------------------------------------- models the engine cannot load


def _llama_folder(path):
    from .tiny_models import hf_model, tiny_config

    hf_model(tiny_config("llama")).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    pytest.importorskip("torch")
    return _llama_folder(tmp_path_factory.mktemp("models") / "llama")


def _corrupt(name: str, src, dst) -> str:
    """A copy of the saved tiny Llama `src` at `dst`, broken the way `name` says; returns the file to name."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights, config = dst / "model.safetensors", dst / "config.json"
    if name == "config not JSON":
        config.write_text("{not json")
        return "config.json: not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"
    if name == "config a list":
        config.write_text("[1, 2]")
        return "config.json: not a model config (a JSON list, not an object)"
    if name == "config without model_type":
        config.write_text(json.dumps({"hidden_size": 64}))
        return "config.json: not a model config (no 'model_type')"
    if name == "config gpt2":
        config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
        return "config.json: unsupported model_type 'gpt2'; supported: ['llama'"
    if name == "config unknown model_type":
        config.write_text(json.dumps({"model_type": "frobnicator"}))
        return "config.json: unsupported model_type 'frobnicator'"
    if name == "zero heads":
        config.write_text(json.dumps({**json.loads(config.read_text()), "num_attention_heads": 0}))
        return "config.json: num_attention_heads must be a positive integer, got 0"
    if name == "hidden not an int":
        config.write_text(json.dumps({**json.loads(config.read_text()), "hidden_size": "big"}))
        return "config.json: hidden_size must be a positive integer, got 'big'"
    if name == "no weights":
        weights.unlink()
        return "no *.safetensors or pytorch_model*.bin weights in"
    if name == "truncated safetensors":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return "model.safetensors: not a readable safetensors file (Error while deserializing header"
    if name == "empty safetensors":
        weights.write_bytes(b"")
        return "model.safetensors: not a readable safetensors file"
    if name == "garbage .bin":
        weights.unlink()
        (dst / "pytorch_model.bin").write_bytes(b"not a pickle")
        return "pytorch_model.bin: cannot read PyTorch weights"
    if name == "missing tensor":
        sd = load_file(weights)
        del sd["model.layers.1.mlp.down_proj.weight"]
        save_file(sd, weights)
        return "the weights lack 1 of the 20 tensors config.json needs, e.g. ['model.layers.1.mlp.down_proj.weight']"
    if name == "wrong shape":
        sd = load_file(weights)
        sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 64)
        save_file(sd, weights)
        return "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [8, 64], but " \
               "config.json needs [64, 64]"
    if name == "missing shard":
        (dst / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
        return "model.safetensors.index.json: lists 1 shard(s) that are missing, e.g. " \
               "'model-00002-of-00002.safetensors'"
    if name == "broken tokenizer":
        (dst / "tokenizer.json").write_text("{broken")
        return "tokenizer.json: "
    raise AssertionError(name)


MODEL_DEFECTS = ["config not JSON", "config a list", "config without model_type", "config gpt2",
                 "config unknown model_type", "zero heads", "hidden not an int", "no weights",
                 "truncated safetensors", "empty safetensors", "garbage .bin", "missing tensor", "wrong shape",
                 "missing shard", "broken tokenizer"]


@pytest.mark.parametrize("defect", MODEL_DEFECTS)
def test_corrupt_model_folders_are_one_line_naming_the_file(defect, saved_llama, tmp_path, capsys):
    folder = tmp_path / "m"
    needle = _corrupt(defect, saved_llama, folder)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"tokens": [1, 2, 3], "max_tokens": 1}) + "\n")
    for argv in (["generate", str(folder), "1,2", "--device", "cpu"],
                 ["replay", str(trace), "--model", str(folder), "--device", "cpu"],
                 ["bench", "--model", str(folder), "--device", "cpu"]):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == "", err
        line = _one_error_line(err)
        assert f"cannot load model {folder}: " in line and needle in line


@pytest.mark.parametrize("content, needle", [
    ("{not json", "c.json: not valid JSON (Expecting property name"),
    ("null", "c.json: not a model config (a JSON NoneType, not an object)"),
    (json.dumps({"model_type": "gpt2"}), "c.json: unsupported model_type 'gpt2'"),
    (json.dumps({**TINY_LLAMA, "num_attention_heads": 0}), "c.json: num_attention_heads must be a positive integer"),
    (json.dumps({**TINY_LLAMA, "vocab_size": -5}), "c.json: vocab_size must be a positive integer, got -5"),
    (json.dumps({**TINY_LLAMA, "num_attention_heads": 3}), "c.json: The hidden size (32) is not a multiple of the "
                                                            "number of attention heads (3)"),
    (json.dumps({**TINY_LLAMA, "hidden_size": 2, "num_attention_heads": 2}), "c.json: head_dim 1 (hidden_size 2 / 2 "
                                                                             "heads) must be even"),
])
def test_bad_config_json_files_are_one_line_naming_the_file(tmp_path, capsys, content, needle):
    pytest.importorskip("torch")
    cfg = tmp_path / "c.json"
    cfg.write_text(content)
    code, out, err = _run(["generate", str(cfg), "1,2", "--device", "cpu"], capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


def test_corrupt_gguf_files_are_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf", reason="gguf not installed: pip install gguf accelerate")
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    for data, needle in ((b"GGUF\x03\x00\x00\x00garbage", "bad.gguf: cannot read its metadata (struct.error"),
                         (b"not a gguf", "bad.gguf' is not a GGUF file"), (b"", "bad.gguf' is not a GGUF file")):
        bad.write_bytes(data)
        code, out, err = _run(["generate", str(bad), "1,2", "--device", "cpu"], capsys)
        assert code == 2 and out == ""
        assert needle in _one_error_line(err)


@pytest.mark.parametrize("argv, needle", [
    (["--kv-dtype", "int8"], "argument --kv-dtype: invalid choice: 'int8'"),
    (["--kv-dtype", ""], "argument --kv-dtype: invalid choice: ''"),
    (["--kv-dtype", "FP8"], "argument --kv-dtype: invalid choice: 'FP8'"),
    (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--dtype", "fp8_e4m3"], "argument --dtype: invalid choice: 'fp8_e4m3'"),  # a KV dtype, not a compute one
])
def test_bad_dtypes_are_one_line(models, capsys, argv, needle):
    code, out, err = _run(["generate", str(models / "llama.json"), "1,2", *argv], capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


@pytest.mark.parametrize("argv, needle", [
    (["--num-pages", "1"], "--num-pages 1 is too small: the longest prompt (208 tokens) plus --max-tokens 2 needs 14 "
                           "pages of 16 tokens"),
    (["--num-pages", "13"], "--num-pages 13 is too small"),
    (["--max-tokens", "20000"], "plus --max-tokens 20000 exceeds the model's context of 16,384 tokens"),
    (["--shots", "200"], "the longest prompt (32,048 tokens: --shots 200) plus --max-tokens 2 exceeds the model's "
                         "context"),
    (["--hidden", "1"], "cannot build the default random model (--hidden 1, --layers 1): head_dim 1 (hidden_size 1 "
                        "/ 1 heads) must be even"),
    (["--hidden", "130"], "cannot build the default random model (--hidden 130, --layers 1): RoPE requires an even"),
    (["--page-size", "0"], "argument --page-size: expected a positive integer, got 0"),
    (["--shots", "0"], "argument --shots: expected a positive integer, got 0"),
    (["--device", "bogus"], "invalid device 'bogus'"),
    (["--gsm8k", "{d}/nowhere"], "--gsm8k {d}/nowhere: No such file or directory"),
    (["--gsm8k", "{d}"], "--gsm8k {d}: No such file or directory: {d}/train.jsonl"),
])
def test_degenerate_bench_flags_are_one_line(tmp_path, capsys, argv, needle):
    pytest.importorskip("torch")
    base = ["bench", "--device", "cpu", "--hidden", "64", "--layers", "1", "--shots", "1", "--prompts", "1",
            "--max-tokens", "2"]
    code, out, err = _run(base + [a.format(d=tmp_path) for a in argv], capsys)
    assert code == 2 and out == ""
    assert needle.format(d=tmp_path) in _one_error_line(err)


def test_bench_pool_larger_than_memory_is_one_line(capsys):
    pytest.importorskip("torch")
    # 2**31 - 1 pages of 16 tokens of K and V: terabytes, refused before any allocation (engine/size_checks.py)
    code, out, err = _run(["bench", "--device", "cpu", "--hidden", "64", "--layers", "1",
                           "--num-pages", str(2**31 - 1)], capsys)
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert "the default random model (--hidden 64, --layers 1)" in line
    assert "num_pages=2,147,483,647: 2,147,483,647 KV pages" in line and "more than the cpu device's" in line


def test_bad_input_from_a_real_process_has_no_traceback(tmp_path, saved_llama):
    """The same front door in a real process: gzip trace, folder as JSONL, truncated weights."""
    (tmp_path / "t.jsonl.gz").write_bytes(_gzip(_good_line().encode()))
    (tmp_path / "d").mkdir()
    folder = tmp_path / "m"
    _corrupt("truncated safetensors", saved_llama, folder)
    for argv, needle in ((["replay", str(tmp_path / "t.jsonl.gz"), "--skip-bad"], "is gzip-compressed"),
                         (["replay", str(tmp_path / "d"), "--format", "radixkv"], "is a folder"),
                         (["generate", str(folder), "1,2", "--device", "cpu"], "not a readable safetensors file")):
        out = subprocess.run([sys.executable, "-m", "radixkv", *argv], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == ""
        assert needle in _one_error_line(out.stderr)
