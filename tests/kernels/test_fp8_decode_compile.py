"""paged_decode_fp8 (Gluon) has no CPU interpreter path; its numbers are checked on the GPU by
benchmarks/kernels/bench_kernels.py. Here it is compiled for sm_90 with the installed Triton's own ptxas,
which runs its compile-time checks: every register relabelling must be a trivial layout
conversion (assert_trivial), and the default configuration must not spill."""
from __future__ import annotations

import pytest
from sm90_compile import compile_sm90

pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere")

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import radixkv.kernels.decode_fp8_gluon as m

fn = m._fp8_decode_kernel
cfg = json.loads(sys.argv[1])
types = {a: "i32" for a in fn.arg_names}
scale = cfg.pop("scale", "fp16")  # KVStore's scales
types.update(q_ptr="*" + cfg.pop("q"), kc_ptr="*i32", vc_ptr="*i32", ks_ptr="*" + scale, vs_ptr="*" + scale,
             pt_ptr="*i32", lens_ptr="*i32", out_ptr="*bf16", mid_o_ptr="*fp32", mid_lse_ptr="*fp32",
             qk_scale="fp32")
maxnreg = cfg.pop("maxnreg")
consts = dict(BLOCK_N=m.BLOCK_N, **cfg)
types.update({c: "constexpr" for c in consts})
k = triton.compile(GluonASTSource(fn, types, consts, {}), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 1, "maxnreg": maxnreg})
"""


def _compile(**cfg) -> dict:
    return compile_sm90(_COMPILE, cfg)


def test_default_config_compiles_without_spills():
    from radixkv.kernels.dispatch import max_registers, resident_warps_per_sm

    cap = max_registers(128, 4)
    res = _compile(q="bf16", GROUP=4, HEADS=8, HEAD_DIM=128, PAGE_SIZE=16, SPLIT=True, OFF_64=False, E5M2=False,
                   maxnreg=cap)
    # Triton 3.6's ptxas (the one the H200 runs) fits the cap with no stack; Triton 3.9's (a newer
    # CUDA) spills 72-80 bytes there. More than that means the kernel's register use has grown.
    import triton

    assert res["stack"] <= (0 if triton.__version__.startswith("3.6") else 96), res
    assert res["regs"] <= cap
    assert resident_warps_per_sm(128, 4) == 12  # the residency choose_num_splits plans for (test_dispatch.py)


@pytest.mark.parametrize(("cfg", "wide", "off64"), [
    ({"q": "fp16", "GROUP": 1, "HEADS": 8, "HEAD_DIM": 64, "PAGE_SIZE": 1, "SPLIT": False, "E5M2": True}, False, True),
    ({"q": "bf16", "GROUP": 16, "HEADS": 16, "HEAD_DIM": 128, "PAGE_SIZE": 32, "SPLIT": True, "E5M2": False},
     False, False),
    ({"q": "bf16", "GROUP": 16, "HEADS": 16, "HEAD_DIM": 64, "PAGE_SIZE": 16, "SPLIT": True, "E5M2": False},
     False, False),
    ({"q": "bf16", "GROUP": 4, "HEADS": 8, "HEAD_DIM": 128, "PAGE_SIZE": 16, "SPLIT": False, "E5M2": False,
      "scale": "fp32"}, True, False),
    ({"q": "bf16", "GROUP": 4, "HEADS": 8, "HEAD_DIM": 128, "PAGE_SIZE": 3, "SPLIT": True, "E5M2": False},
     False, False),  # pages that split 4-token blocks: a page id per token
])
def test_other_shapes_compile(cfg, wide, off64):
    """Head dim 64 (other relabelling permutations), group 1 and 16, e5m2, 64-bit offsets, float32
    scales, a wide launch, page size 3: each at the cap the launcher gives it, with at most a small spill."""
    from radixkv.kernels.dispatch import max_registers

    cap = max_registers(cfg["HEAD_DIM"], cfg["GROUP"], off64, wide, cfg["PAGE_SIZE"])
    res = _compile(**cfg, OFF_64=off64, maxnreg=cap)
    assert res["regs"] <= cap and res["stack"] <= 96, res
