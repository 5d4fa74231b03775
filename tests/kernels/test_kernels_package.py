"""radixkv.kernels' public names are the launchers, whichever import comes first (fresh interpreters)."""
import os
import subprocess
import sys

CHECK = """
import importlib, sys
import radixkv.kernels.store, radixkv.kernels.decode   # submodules first: they do not shadow the launchers
from radixkv import kernels
from radixkv.kernels import paged_decode, paged_prefill, store_kv
assert store_kv is radixkv.kernels.store.store_kv and paged_decode is radixkv.kernels.decode.paged_decode
assert paged_prefill is importlib.import_module("radixkv.kernels.prefill").paged_prefill
assert all(callable(f) for f in (store_kv, paged_decode, paged_prefill))
"""


def _run(code: str, **env: str) -> None:
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_launcher_names_survive_import_order():
    _run(CHECK, TRITON_INTERPRET="1")


def test_package_import_does_not_import_triton():
    # dispatch.py decides for the Gluon kernels without importing them (or Triton) at import
    _run("import sys, radixkv.kernels, radixkv.kernels.reference_attention, radixkv.kernels.reference_layers, "
         "radixkv.kernels.reference_sampling, radixkv.kernels.dispatch, radixkv.kernels.fp8, "
         "radixkv.kernels.launch, radixkv.engine.attention; assert 'triton' not in sys.modules")
