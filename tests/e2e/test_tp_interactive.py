"""Tensor parallelism from a script read from stdin, or one without the `__main__` guard (issue 33 item 16):
the ranks start with the forkserver method, which re-imports the main module in each of them; the error
says so, and what to do, instead of only "rank 1 exited with status 1 while starting"."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BUILD = (f"import sys\nsys.path.insert(0, {str(HERE)!r})\nfrom tiny_models import tiny_config\nfrom radixkv import LLM\n")
LLM_CALL = ('LLM(tiny_config("llama"), dtype="float32", device="cpu", page_size=4, num_pages=96, '
            'tensor_parallel_size=2, dist_timeout_s=20).generate([[5, 6, 7]])\nprint("served")\n')
GUARD = 'if __name__ == "__main__":'


def _run(args: list[str], stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=240, cwd=cwd)


def test_a_script_from_stdin_is_refused_saying_why(tmp_path) -> None:
    proc = _run(["-"], stdin=BUILD + LLM_CALL, cwd=tmp_path)
    assert proc.returncode != 0 and "served" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert "TensorParallelError: tensor parallelism cannot start from a script read from stdin" in last, proc.stderr
    assert GUARD in last and "re-imports the main module" in last


def test_a_script_without_the_guard_says_why_its_ranks_died(tmp_path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(BUILD + LLM_CALL)
    proc = _run([str(script)], cwd=tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "rank 1 exited with status 1 while starting" in last and GUARD in last, proc.stderr


def test_a_guarded_script_runs(tmp_path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text(BUILD + GUARD + "\n    " + LLM_CALL.replace("\n", "\n    ").rstrip() + "\n")
    proc = _run([str(script)], cwd=tmp_path)
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stderr[-3000:]
