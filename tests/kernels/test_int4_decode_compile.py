"""paged_decode_int4 (Gluon) has no CPU interpreter path; its numbers are checked on the GPU by
benchmarks/kernels/check_int_kv.py (kernel_checks.int_checks: head_dim 64 and 128).
Here it is compiled for sm_90 with the installed Triton's own ptxas, which runs its compile-time checks (K's
relabelled planes must be trivial layout conversions) and reports registers: at the launcher's cap, no spill
in the engine's configurations."""
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
# launch() passes the packed pages as int32 words and each group's (s, z) as one int32 word
types.update(q_ptr="*" + cfg.pop("q"), kc_ptr="*i32", vc_ptr="*i32", ks_ptr="*i32", vs_ptr="*i32",
             pt_ptr="*i32", lens_ptr="*i32", out_ptr="*bf16", mid_o_ptr="*fp32", mid_lse_ptr="*fp32",
             qk_scale="fp32")
maxnreg = cfg.pop("maxnreg")
consts = dict(BLOCK_N=m.BLOCK_N, HEADS=8 if cfg["GROUP"] <= 8 else 16, **cfg)
types.update({c: "constexpr" for c in consts})
# Pointers and strides the launch specialises as multiples of 16 in KVStore's layout (not a token's row
# stride in the page words or the pair words: 8 / 4 words at head_dim 64), so loads vectorise as they will.
div = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
       if a.endswith("_ptr") or (a.startswith("stride") and a not in ("stride_qh", "stride_cs", "stride_xs"))}
k = triton.compile(GluonASTSource(fn, types, consts, div), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 1, "maxnreg": maxnreg})
"""


def _compile(**cfg) -> dict:
    """cfg: q, GROUP, HEAD_DIM, GROUPS, PAGE_SIZE, SPLIT, OFF_64; compiled at the launcher's register cap."""
    from radixkv.kernels.dispatch import max_registers

    cap = max_registers(cfg["HEAD_DIM"], cfg["GROUP"], cfg["OFF_64"], False, cfg["PAGE_SIZE"])
    return {"cap": cap, **compile_sm90(_COMPILE, {**cfg, "maxnreg": cap})}


@pytest.mark.parametrize("cfg, max_stack", [
    # head_dim 64 (groups of 16, two a plane: 8-byte pair loads), SmolLM2's GQA group 3, split
    ({"q": "bf16", "GROUP": 3, "HEAD_DIM": 64, "GROUPS": 4, "PAGE_SIZE": 16, "SPLIT": True, "OFF_64": False}, 0),
    # head_dim 128 (groups of 64, one a plane: a pair load a token), Llama-8B's group 4
    ({"q": "bf16", "GROUP": 4, "HEAD_DIM": 128, "GROUPS": 2, "PAGE_SIZE": 16, "SPLIT": True, "OFF_64": False}, 0),
    # a page id per token, 64-bit offsets, 16 heads, fp16 q, one split: a small spill allowed
    ({"q": "fp16", "GROUP": 16, "HEAD_DIM": 64, "GROUPS": 4, "PAGE_SIZE": 3, "SPLIT": False, "OFF_64": True}, 96),
    # 16 heads at head_dim 128 (255 registers), 32-token pages
    ({"q": "bf16", "GROUP": 16, "HEAD_DIM": 128, "GROUPS": 2, "PAGE_SIZE": 32, "SPLIT": True, "OFF_64": False}, 96),
])
def test_compiles_within_the_register_cap(cfg, max_stack):
    res = _compile(**cfg)
    assert res["regs"] <= res["cap"] and res["stack"] <= max_stack, res
