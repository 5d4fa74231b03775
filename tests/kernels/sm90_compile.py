"""Compile a Gluon kernel for sm_90 with the installed Triton's own ptxas, in a fresh interpreter
(the kernel tests' conftest sets TRITON_INTERPRET=1, under which Triton's standard functions are
interpreter objects that the Gluon compiler cannot take), and read its resource use."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Appended to a compile script that leaves the compiled kernel in `k`.
RESOURCE_USAGE = r"""
import json, os, re, subprocess, tempfile
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
os.unlink(f.name)
regs, stack = re.search(r"REG:(\d+)\s+STACK:(\d+)", usage).groups()
print(json.dumps({"regs": int(regs), "stack": int(stack), "shared": k.metadata.shared}))  # dynamic shared bytes
"""


def compile_sm90(script: str, cfg: dict) -> dict:
    """Run `script` (which reads json.loads(sys.argv[1]) and compiles into `k`) plus RESOURCE_USAGE:
    {"regs", "stack", "shared"}. Skips when this Triton ships no ptxas."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script + RESOURCE_USAGE, json.dumps(cfg)], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    if done.returncode != 0 and ("ptxas" in done.stderr and "not found" in done.stderr):
        pytest.skip("this Triton has no ptxas")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
