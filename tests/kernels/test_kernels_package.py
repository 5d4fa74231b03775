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


def test_launchers_survive_patch_and_del():
    code = """
from unittest import mock
import radixkv.kernels as k
with mock.patch.object(k, "paged_decode"):  # patched before first use: mock deletes it on exit
    pass
with mock.patch("radixkv.kernels.store_kv"):
    pass
from radixkv.kernels.paged_decode import paged_decode
assert k.paged_decode is paged_decode and callable(k.store_kv)
del k.paged_decode
assert k.paged_decode is paged_decode
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_package_import_does_not_import_triton():
    code = "import sys, radixkv.kernels, radixkv.kernels.reference; assert 'triton' not in sys.modules"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
