"""Size flags are bounded (issue 33 item 9): a request's tokens by 2**24 (what the trace readers take),
counts by 2**20, replicas by 1,024, and what a generator or a benchmark would build in all; each refusal
is one usage line, exit 2, before anything is built.

Run in a child process with a time limit and an address-space cap: a size that is not refused would
otherwise grow until the machine stops it."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from radixkv.argtypes import MAX_REQUEST_TOKENS, count, token_count
from radixkv.workloads.trace_records import MAX_REQUEST_TOKENS as READERS_MAX


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def radixkv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "radixkv", *args], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limits, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"radixkv {' '.join(args)} ran past {timeout} s: the size was not refused")


BENCH = ["bench-serve", "--base-url", "http://127.0.0.1:9"]


@pytest.mark.parametrize("argv, needle", [
    (["gen", "shared-prefix", "--system-len", "1000000000"], "--system-len: expected a positive integer of at most 16,777,216"),
    (["gen", "shared-prefix", "--groups", "1000000000"], "--groups: expected a positive integer of at most 1,048,576"),
    (["gen", "shared-prefix", "--prompts", "1000000000"], "--prompts"),
    (["gen", "multi-turn", "--sessions", "1000000000"], "--sessions"),
    (["gen", "few-shot", "--shots", "1000000000"], "--shots"),
    (["gen", "shared-prefix", "--system-len", "16777216"], "more than 16,777,216 (2**24 tokens a request)"),
    (["gen", "shared-prefix", "--groups", "100000"], "prompt tokens in all"),
    (["gen", "multi-turn", "--turns", "100000", "--sessions", "1000"], "prompt tokens in all"),
    (["gen", "few-shot", "--shots", "200000"], "2**24 tokens a request"),
    (["replay", "--replicas", "1000000"], "--replicas: expected a positive integer of at most 1,024"),
    (["replay", "--concurrency", "99999999999"], "--concurrency"),
    (BENCH + ["--random-input-len", "1000000000"], "--random-input-len: expected a positive integer of at most 16,777,216"),
    (BENCH + ["--random-output-len", "1000000000"], "--random-output-len"),
    (BENCH + ["--num-prompts", "1000000000"], "--num-prompts"),
    (BENCH + ["--random-input-len", "16000000", "--random-prefix-len", "1000000"], "2**24 tokens a request"),
    (BENCH + ["--random-input-len", "1000000", "--num-prompts", "1000"], "prompt tokens, more than a benchmark builds"),
    (BENCH + ["--random-range-ratio", "5"], "--random-range-ratio: expected a number in [0, 1)"),
    (BENCH + ["--dataset-name", "prefix-repetition", "--prefix-repetition-prefix-len", "100000000"],
     "--prefix-repetition-prefix-len"),
    (BENCH + ["--dataset-name", "prefix-repetition", "--prefix-repetition-num-prefixes", "1000000000"],
     "--prefix-repetition-num-prefixes"),
])
def test_size_flags_past_their_bound_are_one_usage_line(tmp_path, argv, needle) -> None:
    if argv[0] == "gen":
        argv = argv + ["-o", str(tmp_path / "out.jsonl")]
    proc = radixkv(*argv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("radixkv: error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_the_bounds_are_the_readers() -> None:
    assert MAX_REQUEST_TOKENS == READERS_MAX == 2**24
    assert token_count(str(2**24)) == 2**24 and count(str(2**20)) == 2**20


def test_sizes_at_the_bound_still_run(tmp_path) -> None:
    proc = radixkv("gen", "shared-prefix", "--groups", "2", "--prompts", "2", "--system-len", "100000",
                   "-o", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 0, proc.stderr
