"""Files a command is pointed at that are not what they claim (issue 33 item 8): a FIFO, /dev/zero, a
huge file. Each is refused in one line, exit 2, before anything is read; what is read is bounded.

The commands run in a child process with a time limit and an address-space cap, so that a command
that blocks on a FIFO or reads /dev/zero without end fails the test instead of hanging it."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from radixkv.files import UnreadableFile, check_regular, read_bounded


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def radixkv(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "radixkv", *args], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limits, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"radixkv {' '.join(args)} did not end within {timeout} s (blocked, or reading without end)")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixkv: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_plan_refuses_a_fifo_a_device_and_a_huge_file(tmp_path: Path, fifo: Path) -> None:
    _refused(radixkv("plan", str(fifo), "--gpu-memory", "80GiB"), "FIFO", str(fifo))
    _refused(radixkv("plan", "/dev/zero", "--gpu-memory", "80GiB"), "character device")
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    _refused(radixkv("plan", str(folder), "--gpu-memory", "80GiB"), "FIFO", "config.json")
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(1 << 30)  # a sparse GiB: nothing of it may be read
    _refused(radixkv("plan", str(big), "--gpu-memory", "80GiB"), "1.0 GiB", "more than")
    os.mkfifo(tmp_path / "m.gguf")
    _refused(radixkv("plan", str(tmp_path / "m.gguf"), "--gpu-memory", "80GiB"), "FIFO")


def test_replay_and_gen_refuse_a_fifo_and_a_device(tmp_path: Path, fifo: Path) -> None:
    _refused(radixkv("replay", str(fifo)), "FIFO")
    _refused(radixkv("replay", "/dev/zero"), "character device")
    _refused(radixkv("gen", "multi-turn", "-o", str(tmp_path / "o.jsonl"), "--source", str(fifo)), "--source", "FIFO")


@pytest.mark.parametrize("name", ["sharegpt", "trace"])
def test_bench_serve_refuses_a_fifo_and_a_device_before_any_request(fifo: Path, name: str) -> None:
    base = ["bench-serve", "--base-url", "http://127.0.0.1:9", "--dataset-name", name]
    _refused(radixkv(*base, "--dataset-path", str(fifo)), "--dataset-path", "FIFO")
    _refused(radixkv(*base, "--dataset-path", "/dev/zero"), "--dataset-path", "character device")


def test_bench_serve_refuses_a_sharegpt_file_past_the_bound(tmp_path: Path, monkeypatch) -> None:
    from radixkv.serve import bench_datasets
    from radixkv.serve.bench_results import BenchError

    path = tmp_path / "sharegpt.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]')
    assert len(bench_datasets.sharegpt_dataset(str(path), 5)) == 1
    monkeypatch.setattr(bench_datasets, "MAX_SHAREGPT_BYTES", 16)
    with pytest.raises(BenchError, match="more than a ShareGPT JSON file may hold"):
        bench_datasets.sharegpt_dataset(str(path), 5)
    path.write_text("[" * 200_000)
    monkeypatch.undo()
    with pytest.raises(BenchError, match="not JSON"):
        bench_datasets.sharegpt_dataset(str(path), 5)


def test_read_bounded_reads_regular_files_only_and_at_most_the_bound(tmp_path: Path, fifo: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 100)
    assert read_bounded(path, 100) == b"x" * 100
    with pytest.raises(UnreadableFile, match="100 bytes, more than a config may hold"):
        read_bounded(path, 99, "config")
    with pytest.raises(UnreadableFile, match="FIFO"):
        read_bounded(fifo, 10)  # opened without blocking, refused on the descriptor
    with pytest.raises(UnreadableFile, match="character device"):
        read_bounded("/dev/zero", 10)
    with pytest.raises(UnreadableFile, match="more than"):
        read_bounded("/proc/self/status", 10)  # says size 0, holds more
    with pytest.raises(UnreadableFile, match="folder"):
        read_bounded(tmp_path, 10)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing", 10)
    assert check_regular(tmp_path, folder_ok=True)
    with pytest.raises(UnreadableFile, match="FIFO"):
        check_regular(fifo, folder_ok=True)


def test_the_engine_reads_no_fifo_or_device_as_a_config(fifo: Path) -> None:
    pytest.importorskip("torch")
    from radixkv.engine.model_config import read_config_dict

    with pytest.raises(UnreadableFile, match="FIFO"):
        read_config_dict(str(fifo))
    with pytest.raises(UnreadableFile, match="character device"):
        read_config_dict("/dev/zero")
