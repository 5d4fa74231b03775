"""Launch options and default tiles chosen by kernels/launch.py (no kernel runs)."""
import torch

from radixkv.kernels.launch import (CPU_TILES, DECODE_FP8_GPU, DECODE_GPU, PREFILL_GPU_BY_LEN, KernelConfig, KernelKind,
                                    default_config, launch_options)


def test_register_cap_reaches_triton_on_gpu_only():
    cfg = KernelConfig(128, 64, 8, 3, max_registers=128)
    assert launch_options(cfg, torch.device("cuda")) == {"num_warps": 8, "num_stages": 3, "maxnreg": 128}
    assert launch_options(cfg._replace(max_registers=None), torch.device("cuda")) == {"num_warps": 8, "num_stages": 3}
    assert launch_options(cfg, torch.device("cpu")) == {}  # the interpreter takes no launch options


def test_default_tiles_by_dtype():
    q16 = torch.empty(1, 4, 128, dtype=torch.bfloat16)
    cache16 = torch.empty(2, 16, 1, 128, dtype=torch.bfloat16)
    cache8 = torch.empty(2, 16, 1, 128, dtype=torch.float8_e4m3fn)
    assert default_config(KernelKind.DECODE, q16, cache16) is CPU_TILES
    gpu_q = type("FakeGpuTensor", (), {"device": torch.device("cuda"), "element_size": lambda self: 2})()
    assert default_config(KernelKind.DECODE, gpu_q, cache16) is DECODE_GPU
    assert default_config(KernelKind.DECODE, gpu_q, cache8) is DECODE_FP8_GPU
    tiles = {n: default_config(KernelKind.PREFILL, gpu_q, cache16, max_q_len=n)[:2] for n in (None, 1, 64, 65, 128, 512)}
    assert tiles == {None: (256, 64), 1: (64, 64), 64: (64, 64), 65: (128, 64), 128: (128, 64), 512: (256, 64)}
    assert default_config(KernelKind.PREFILL, gpu_q, cache16, max_q_len=100).max_registers == 128
    assert default_config(KernelKind.PREFILL, gpu_q, cache8, max_q_len=100)[:2] == (256, 64)  # fp8: no capped tier
    assert PREFILL_GPU_BY_LEN[-1][0] is None  # every length has a config


def test_merge_warps_by_partials():
    from radixkv.kernels.launch import merge_warps

    # one warp up to 64 partial values a thread (3 or 16 splits of 128 dims), at most 8 warps
    assert [merge_warps(s, 128) for s in (2, 4, 16, 32, 128)] == [1, 1, 1, 2, 8]
    assert merge_warps(256, 256) == 8
