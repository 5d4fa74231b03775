"""The defaults the engine decides (issue 31 item 3): max_num_seqs from the KV pool and cascade on CUDA, as pure
functions of the pool, the device and the KV dtype; and which LLM(...) keywords leave them to the engine."""
from __future__ import annotations

import pytest

from radixkv.config import (
    ENGINE_STEP_BUDGET,
    OFFLINE_STEP_BUDGET,
    EngineConfig,
    KVDtype,
    SchedulerConfig,
    engine_cascade,
    engine_max_running,
    engine_step_budget,
)
from radixkv.engine.cuda_graphs import batch_buckets
from radixkv.plan import graph_reserve_bytes, kv_window_for

POOLS = {  # pool tokens of an 8B-shaped model (128 KiB a bf16 token) for a few pool sizes
    "tiny": 16_384, "24GB card": 50_000, "edge": 131_072, "half": 300_000, "H200 bf16": 857_696,
    "H200 fp8": 1_678_592,
}


@pytest.mark.parametrize("pool, want", [(0, 256), (16_384, 256), (50_000, 256), (131_071, 256), (131_072, 256),
                                        (131_584, 257), (300_000, 585), (524_288, 1024), (857_696, 1024),
                                        (1_678_592, 1024), (10**9, 1024)])
def test_cuda_max_running_grows_with_the_pool_between_256_and_1024(pool: int, want: int) -> None:
    assert engine_max_running(pool, ENGINE_STEP_BUDGET, "cuda", None) == want
    assert engine_max_running(pool, ENGINE_STEP_BUDGET, "cuda", 0) == want  # kv_window=0: no window


@pytest.mark.parametrize("pool", sorted(POOLS.values()))
@pytest.mark.parametrize("device", ["cpu", "mps", "meta"])
def test_other_devices_keep_256(pool: int, device: str) -> None:
    assert engine_max_running(pool, ENGINE_STEP_BUDGET, device, None) == SchedulerConfig().max_running == 256


@pytest.mark.parametrize("kv", list(KVDtype))
@pytest.mark.parametrize("pool", [50_000, 857_696, 1_678_592])
def test_a_recent_token_window_keeps_256(kv: KVDtype, pool: int) -> None:
    """INT4/INT2 pages take a window by default (shadow pages per possible running row): 256 there; any other
    dtype, or INT pages with the window turned off, follow the pool."""
    for given in (None, 0, 16):
        window = kv_window_for(kv, given)
        got = engine_max_running(pool, ENGINE_STEP_BUDGET, "cuda", window)
        if window:
            assert got == 256
        else:
            assert got == max(256, min(1024, pool // 512))
    assert bool(kv_window_for(kv, None)) == kv.is_int


def test_graph_memory_is_reserved_once_not_per_bucket() -> None:
    """1,024 decode rows with Llama-3's 128,256-word vocabulary: the graphs' reserve is one logits buffer and one
    step's activations, ~1 GiB (one fp32 output per captured bucket would have been ~16 GiB)."""
    h, inter, vocab, itemsize = 4096, 14336, 128_256, 2
    reserve = graph_reserve_bytes(h, inter, vocab, 1024, 0, itemsize)
    assert reserve == 1024 * ((4 * inter + 8 * h) * itemsize + vocab * 6)
    assert reserve < 2**30 < 15 * 2**30 < sum(batch_buckets(1024)) * vocab * 4
    mixed = graph_reserve_bytes(h, inter, vocab, 1024, 1024, itemsize) - reserve
    assert mixed == 1024 * ((4 * inter + 8 * h) * itemsize + 4 * h * itemsize)


def test_the_running_set_never_exceeds_the_step_budget_but_stays_at_least_256() -> None:
    assert engine_max_running(10**9, 512, "cuda", None) == 512
    assert engine_max_running(10**9, 64, "cuda", None) == 256  # a tiny budget keeps the old default
    assert engine_max_running(10**9, 8192, "cuda", None) == 1024


@pytest.mark.parametrize("device, possible, want", [("cuda", True, True), ("cuda", False, False),
                                                    ("cpu", True, False), ("cpu", False, False),
                                                    ("mps", True, False)])
def test_cascade_default_on_cuda_only_where_the_rule_takes_groups(device: str, possible: bool, want: bool) -> None:
    assert engine_cascade(device, possible) is want


def test_from_kwargs_marks_what_was_not_given() -> None:
    cfg = EngineConfig.from_kwargs()
    assert (cfg.auto_max_num_seqs, cfg.auto_cascade) == (True, True)
    assert (cfg.scheduler.max_running, cfg.scheduler.cascade) == (256, False)  # until the engine decides
    for kw in ({"max_num_seqs": 8}, {"max_running": 8}):
        c = EngineConfig.from_kwargs(**kw)
        assert (c.auto_max_num_seqs, c.auto_cascade, c.scheduler.max_running) == (False, True, 8)
    for flag in (True, False):
        c = EngineConfig.from_kwargs(cascade=flag)
        assert (c.auto_max_num_seqs, c.auto_cascade, c.scheduler.cascade) == (True, False, flag)
    c = EngineConfig.from_kwargs(scheduler=SchedulerConfig(max_running=3))
    assert (c.auto_max_num_seqs, c.auto_cascade, c.scheduler.max_running) == (False, False, 3)
    assert EngineConfig() == EngineConfig(auto_max_num_seqs=False, auto_cascade=False)  # built directly: as given
    with pytest.raises(TypeError, match="auto_cascade"):
        EngineConfig.from_kwargs(auto_cascade=False)
    with pytest.raises(TypeError, match="auto_max_num_seqs"):
        EngineConfig(auto_max_num_seqs=1)  # type: ignore[arg-type]


def test_with_engine_defaults_decides_only_what_was_left_to_it() -> None:
    auto = EngineConfig.from_kwargs()
    big = auto.with_engine_defaults(857_696, "cuda", None, True)
    assert (big.scheduler.max_running, big.scheduler.cascade) == (1024, True)
    assert big.scheduler.max_batch_tokens == OFFLINE_STEP_BUDGET  # LLM(...) on CUDA: throughput
    assert big.with_engine_defaults(857_696, "cuda", None, True) == big  # idempotent
    assert auto.with_engine_defaults(857_696, "cpu", None, True) == auto  # CPU: 256, cascade off
    int4 = auto.with_engine_defaults(857_696, "cuda", 16, False)
    assert (int4.scheduler.max_running, int4.scheduler.cascade) == (256, False)
    given = EngineConfig.from_kwargs(max_num_seqs=64, cascade=False, max_num_batched_tokens=512)
    assert given.with_engine_defaults(857_696, "cuda", None, True) is given
    on = EngineConfig.from_kwargs(cascade=True)
    assert on.with_engine_defaults(16_384, "cpu", None, False).scheduler.cascade is True  # explicit: respected
    assert EngineConfig().with_engine_defaults(857_696, "cuda", None, True) == EngineConfig()


def test_the_step_budget_follows_the_usage_and_the_device() -> None:
    """vLLM's usage contexts: `radixkv serve` keeps the latency knee (2,048), LLM(...) on CUDA takes 8,192 for
    throughput, capped by the pool and never below what the config holds; CPU keeps 2,048; a budget given is kept."""
    assert (engine_step_budget("cuda", "offline"), engine_step_budget("cuda", "serve")) == (8192, 2048)
    assert engine_step_budget("cpu", "offline") == engine_step_budget("cpu", "serve") == ENGINE_STEP_BUDGET
    serve = EngineConfig.from_kwargs(usage="serve").with_engine_defaults(857_696, "cuda", None, True)
    assert serve.scheduler.max_batch_tokens == ENGINE_STEP_BUDGET and serve.scheduler.max_running == 1024
    small = EngineConfig.from_kwargs().with_engine_defaults(4096, "cuda", None, True)
    assert small.scheduler.max_batch_tokens == 4096  # no more than the pool holds
    tiny = EngineConfig.from_kwargs().with_engine_defaults(1024, "cuda", None, True)
    assert tiny.scheduler.max_batch_tokens == ENGINE_STEP_BUDGET  # never below the old default
    assert EngineConfig.from_kwargs(max_batch_tokens=4096).with_engine_defaults(
        857_696, "cuda", None, True).scheduler.max_batch_tokens == 4096
    with pytest.raises(ValueError, match="usage must be one of offline, serve, got 'batch'"):
        EngineConfig.from_kwargs(usage="batch")
    with pytest.raises(TypeError, match="auto_budget"):
        EngineConfig.from_kwargs(auto_budget=True)
