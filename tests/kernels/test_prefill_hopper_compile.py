"""paged_prefill_hopper (Gluon, wgmma) has no CPU path; the GPU benchmark checks its numbers. Here it is
compiled for sm_90 with the installed Triton's ptxas, for both 16-bit dtypes and several page sizes,
and its dispatch rule is checked."""
from __future__ import annotations

import pytest
import torch
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
types = {a: "i32" for a in fn.arg_names}
types.update(q_ptr="*" + dt, kc_ptr="*" + dt, vc_ptr="*" + dt, pt_ptr="*i32", lens_ptr="*i32", qstart_ptr="*i32",
             qlens_ptr="*i32", out_ptr="*" + dt, qk_scale="fp32")
consts = dict(GROUP=4, HEAD_DIM=128, BLOCK_M=m.BLOCK_M, BLOCK_N=m.BLOCK_N, STAGES=m.STAGES, WARPS=m.WARPS, **cfg)
types.update({c: "constexpr" for c in consts})
# What launch.hopper_prefill_supported guarantees: 16-byte aligned pages, page strides divisible by 16
# (q, out and the page table may be unaligned).
aligned = ("kc_ptr", "vc_ptr", "stride_cp", "stride_cs", "stride_ch")
attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in aligned}
k = triton.compile(GluonASTSource(fn, types, consts, attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": m.WARPS, "maxnreg": m.MAX_REGISTERS})
"""


@pytest.mark.parametrize(("dtype", "page_size"), [("bf16", 16), ("fp16", 1), ("bf16", 32)])
def test_compiles_two_programs_per_sm(dtype, page_size):
    res = compile_sm90(_COMPILE, {"dtype": dtype, "PAGE_SIZE": page_size})
    # Two programs of 256 threads per SM: at most 128 registers and 114 KB of shared memory each.
    # Triton 3.6's ptxas (the H200's) keeps 8 bytes of stack, 3.9's none: more means register use has grown.
    assert res["regs"] <= 128 and res["shared"] <= 114 * 1024 and res["stack"] <= 32, res


def test_dispatch_rule_on_cpu_tensors(monkeypatch):
    from radixkv.kernels.launch import (
        HOPPER_PREFILL_ENV,
        HOPPER_PREFILL_MIN_NEW,
        hopper_prefill_enabled,
        hopper_prefill_supported,
    )

    monkeypatch.delenv(HOPPER_PREFILL_ENV, raising=False)
    assert hopper_prefill_enabled()  # on by default; "0" is the way out
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(HOPPER_PREFILL_ENV, off)
        assert not hopper_prefill_enabled()
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "1")
    assert hopper_prefill_enabled()

    q = torch.empty(4, 8, 128, dtype=torch.bfloat16)
    cache = torch.empty(2, 16, 2, 128, dtype=torch.bfloat16)
    assert not hopper_prefill_supported(q, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)  # not a GPU
    gpu = type("FakeGpuTensor", (), {"device": torch.device("cuda", 0), "shape": q.shape, "dtype": q.dtype,
                                     "stride": q.stride, "data_ptr": lambda self: 0})()
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW)  # short: Triton tiles
    half = cache.to(torch.float16)
    assert not hopper_prefill_supported(gpu, half, half, q, 512)  # q and pages differ in dtype
    padded = torch.empty(2, 16, 2, 136, dtype=torch.bfloat16)[..., :128]  # rows 272 bytes apart
    assert not hopper_prefill_supported(gpu, padded, padded, q, 512)
    # ... and with an sm_90 GPU and a Triton new enough for Gluon, the long extend is taken.
    from radixkv.kernels import launch

    monkeypatch.setattr(launch, "_gluon_hopper_gpu", lambda index: True)
    assert hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW)
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "0")
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)  # the way out
