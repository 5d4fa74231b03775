"""paged_prefill_hopper (Gluon, wgmma) has no CPU path; the GPU benchmark checks its numbers. Here it is
compiled for sm_90 with the installed Triton's ptxas, for both 16-bit dtypes and several page sizes.
Its dispatch rule (dispatch.hopper_prefill_supported) is checked in test_dispatch.py."""
from __future__ import annotations

import pytest
from sm90_compile import compile_sm90

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import radixkv.kernels.prefill_hopper_gluon as m

fn = m._extend_kernel
cfg = json.loads(sys.argv[1])
dt = cfg.pop("dtype")
kv = cfg.pop("kv", dt)
fp8 = kv.startswith("fp8")
int4 = kv == "u8"  # INT4 pages: (scale, zero) pairs as fp16
types = {a: "i32" for a in fn.arg_names}
types.update(q_ptr="*" + dt, kc_ptr="*" + kv, vc_ptr="*" + kv, pt_ptr="*i32", lens_ptr="*i32", qstart_ptr="*i32",
             qlens_ptr="*i32", out_ptr="*" + dt, lse_ptr="*fp32", qk_scale="fp32",
             ks_ptr="*fp16" if fp8 or int4 else "*" + kv, vs_ptr="*fp16" if fp8 or int4 else "*" + kv)
consts = dict(GROUP=4, HEAD_DIM=128, BLOCK_M=m.BLOCK_M,
              BLOCK_N=cfg.pop("block_n", m.FP8_BLOCK_N if fp8 or int4 else m.BLOCK_N), STAGES=m.STAGES, WARPS=m.WARPS,
              IS_FP8=fp8, IS_INT4=int4, WRITE_LSE=cfg.pop("lse", False), **cfg)
types.update({c: "constexpr" for c in consts})
# What dispatch.hopper_prefill_supported guarantees: 16-byte aligned pages, page strides divisible by 16
# (q, out and the page table may be unaligned).
aligned = ("kc_ptr", "vc_ptr", "stride_cp", "stride_cs", "stride_ch")
attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in aligned}
k = triton.compile(GluonASTSource(fn, types, consts, attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": m.WARPS, "maxnreg": m.MAX_REGISTERS})
"""


@pytest.mark.parametrize(("dtype", "kv", "page_size", "lse"), [
    ("bf16", "bf16", 16, False), ("fp16", "fp16", 1, False), ("bf16", "bf16", 32, False),
    ("bf16", "fp8e4nv", 16, False), ("fp16", "fp8e5", 1, False), ("bf16", "u8", 16, False), ("fp16", "u8", 3, False),
    ("bf16", "bf16", 16, True), ("bf16", "u8", 16, True),  # lse: the recent-token window's shifted launches
    ("bf16", "fp16", 16, False)])  # fp16 pages under bf16 q: dequant_pages' copies
def test_compiles_two_programs_per_sm(dtype, kv, page_size, lse):
    res = compile_sm90(_COMPILE, {"dtype": dtype, "kv": kv, "PAGE_SIZE": page_size, "lse": lse})
    # Two programs of 256 threads per SM: at most 128 registers and 114 KB of shared memory each.
    # Triton 3.6's ptxas (the H200's) keeps 8 bytes of stack, 3.9's none: more means register use has grown.
    # FP8 pages: the 64-key tiles spill ~80 bytes and still beat 32-key ones, which spill none (RESULTS.md).
    stack = 96 if kv.startswith("fp8") or kv == "u8" else 32
    assert res["regs"] <= 128 and res["shared"] <= 114 * 1024 and res["stack"] <= stack, res
