"""paged_decode_int4 (Gluon) has no CPU interpreter path; its numbers are checked on the GPU by
benchmarks/kernels/check_int_kv.py. Here it is compiled for sm_90 with the installed Triton's own ptxas,
which runs its compile-time checks: every register relabelling of the two bit-planes must be a trivial
layout conversion (assert_trivial), and the default configuration must not spill."""
from __future__ import annotations

import pytest
from sm90_compile import compile_sm90

pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere")

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import radixkv.kernels.decode_int4_gluon as m

fn = m._int4_decode_kernel
cfg = json.loads(sys.argv[1])
types = {a: "i32" for a in fn.arg_names}
# launch() passes the packed pages as int32 words and each token-head's (s0, z0, s1, z1) as one int64
types.update(q_ptr="*" + cfg.pop("q"), kc_ptr="*i32", vc_ptr="*i32", ks_ptr="*i64", vs_ptr="*i64",
             pt_ptr="*i32", lens_ptr="*i32", out_ptr="*bf16", mid_o_ptr="*fp32", mid_lse_ptr="*fp32",
             qk_scale="fp32")
maxnreg = cfg.pop("maxnreg")
consts = dict(BLOCK_N=m.BLOCK_N, HEAD_DIM=128, HEADS=8 if cfg["GROUP"] <= 8 else 16, **cfg)
types.update({c: "constexpr" for c in consts})
k = triton.compile(GluonASTSource(fn, types, consts, {}), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 1, "maxnreg": maxnreg})
"""


def _compile(**cfg) -> dict:
    """cfg: q, GROUP, PAGE_SIZE, SPLIT, OFF_64; compiled at the launcher's register cap."""
    from radixkv.kernels.dispatch import int4_max_registers

    cap = int4_max_registers(cfg["GROUP"], cfg["OFF_64"], cfg["PAGE_SIZE"])
    return {"cap": cap, **compile_sm90(_COMPILE, {**cfg, "maxnreg": cap})}


def test_default_config_compiles_without_spills():
    """Llama-8B's shape at the engine's defaults: bf16 q, GQA group 4, 16-token pages, split, 32-bit
    offsets, at 168 registers (12 programs per SM, the residency choose_num_splits plans for)."""
    res = _compile(q="bf16", GROUP=4, PAGE_SIZE=16, SPLIT=True, OFF_64=False)
    assert res["cap"] == 168
    assert res["stack"] == 0, res
    assert res["regs"] <= res["cap"], res


@pytest.mark.parametrize("cfg", [
    {"q": "fp16", "GROUP": 1, "PAGE_SIZE": 1, "SPLIT": False, "OFF_64": True},  # a page id per token, int64
    {"q": "bf16", "GROUP": 16, "PAGE_SIZE": 32, "SPLIT": True, "OFF_64": False},  # 16 heads: 255 registers
    {"q": "bf16", "GROUP": 8, "PAGE_SIZE": 3, "SPLIT": True, "OFF_64": False},  # 4-token blocks straddle pages
])
def test_other_shapes_compile(cfg):
    """Group 1 / 8 / 16 (HEADS 8 and 16), pages of 1, 3 and 32 tokens, fp16 q, 64-bit offsets, one split
    (the direct store of both planes): each at the cap the launcher gives it, with at most a small spill."""
    res = _compile(**cfg)
    assert res["regs"] <= res["cap"] and res["stack"] <= 96, res
