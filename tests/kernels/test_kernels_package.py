"""radixkv.kernels' public names are the launchers, whichever import comes first (fresh interpreters)."""
import os
import subprocess
import sys

import pytest

CHECK = """
import sys
{first}
from radixkv import kernels
from radixkv.kernels.{name} import {name} as launcher
assert kernels.{name} is launcher and callable(kernels.{name}), kernels.{name}
assert type(sys.modules["radixkv.kernels.{name}"]).__name__ == "module"
"""


@pytest.mark.parametrize("name", ["store_kv", "paged_decode", "paged_prefill"])
@pytest.mark.parametrize("first", ["import radixkv.kernels.{name}", "from radixkv.kernels.{name} import {name}",
                                   "import radixkv.kernels as k; k.{name}"])
def test_launcher_names_survive_import_order(name, first):
    code = CHECK.format(first=first.format(name=name), name=name)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_package_import_does_not_import_triton():
    code = "import sys, radixkv.kernels, radixkv.kernels.reference; assert 'triton' not in sys.modules"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
