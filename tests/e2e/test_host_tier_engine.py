"""The engine's host KV tier (issue 37, engine/host_kv.py): a multi-turn workload whose history overflows a
small GPU pool gives the same greedy tokens with the tier as without it, with hits counted by tier; copies held
back on purpose are never read before they land; a failed copy falls back to recompute with no leak; a prefix
evicted, loaded back and evicted again is copied device-to-host once (CPU, tiny random model, the tree's
invariants checked after every step)."""
from __future__ import annotations

import random

import pytest

from radixkv import LLM, SamplingParams
from radixkv.cache.events import MEDIUM_CPU, MEDIUM_GPU, BlockRemoved, BlockStored, QueuePublisher
from radixkv.engine.core import EngineStats
from radixkv.engine.host_kv import HostKV

from .tiny_models import tiny_config

PAGE = 4
GPU_PAGES = 24  # 96 tokens: four conversations of ~40-60 tokens do not fit
HOST_BYTES = 1 << 20
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def engine(**kw) -> LLM:
    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", page_size=PAGE, num_pages=GPU_PAGES, **kw)
    core, step = llm.core, llm.core.step

    def checked_step():
        out = step()
        core.cache.check_invariants()
        return out

    core.step = checked_step  # every step of every generate below
    return llm


def conversations(llm: LLM, turns: int = 3, convs: int = 4, salts: tuple[str | None, ...] = (None,)) -> list[list[int]]:
    """Round-robin multi-turn chats: each turn re-sends the whole history plus a new user message."""
    rng = random.Random(0)
    hist = [[rng.randrange(5, 150) for _ in range(12)] for _ in range(convs)]
    outs = []
    for _ in range(turns):
        for c in range(convs):
            salt = salts[c % len(salts)]
            o = llm.generate([hist[c]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                                       cache_salt=salt))[0]
            outs.append(o.token_ids)
            hist[c] = hist[c] + o.token_ids + [rng.randrange(5, 150) for _ in range(6)]
    return outs


def assert_no_leak(llm: LLM) -> None:
    core = llm.core
    assert core.reset_prefix_cache()
    core.cache.check_invariants()
    assert core.pool.num_free == core.pool.num_pages
    if core.host_kv is not None:
        assert core.cache.host_pool.num_free == core.cache.host_pool.num_pages


@pytest.fixture(scope="module")
def one_tier() -> tuple[list[list[int]], EngineStats]:
    llm = engine()
    return conversations(llm), llm.core.stats()


@pytest.fixture(scope="module")
def baseline(one_tier) -> list[list[int]]:
    return one_tier[0]


def test_outputs_equal_without_the_tier_and_hits_counted_by_tier(baseline, one_tier):
    llm = engine(host_kv_cache_bytes=HOST_BYTES)
    assert isinstance(llm.core.host_kv, HostKV) and llm.core.host_kv.page_bytes == llm.runner.kv.total_bytes // (
        llm.runner.kv.num_pages)
    assert conversations(llm) == baseline
    s, p = llm.core.stats(), one_tier[1]
    assert s.host_hit_tokens > 0 and s.hit_tokens > p.hit_tokens  # history the GPU pool had dropped came back
    assert s.gpu_hit_tokens + s.host_hit_tokens == s.hit_tokens
    page = llm.core.host_kv.page_bytes
    assert s.bytes_h2d == llm.core.cache.promoted_pages * page and s.bytes_h2d >= s.host_hit_tokens // PAGE * page
    assert s.bytes_d2h == llm.core.cache.demoted_pages * page > 0
    assert s.host_pages == llm.core.host_kv.num_pages and s.failed_copies == 0
    assert_no_leak(llm)


def test_hicache_ratio_sizes_the_tier_from_the_pool(baseline):
    llm = engine(hicache_ratio=2.0)
    assert llm.core.host_kv.num_pages == 2 * GPU_PAGES
    assert conversations(llm) == baseline


def test_delayed_copies_are_never_read_before_they_land(baseline, monkeypatch):
    llm = engine(host_kv_cache_bytes=HOST_BYTES)
    host = llm.core.host_kv
    host.delay_copies = True  # copies queue until the engine fences them
    launch, seen = llm.runner.launch, []

    def checked_launch(batch, *args, **kwargs):
        pending = host.pending_gpu_pages
        seen.append(bool(pending))
        used = {p for row in batch.page_tables for p in row}
        assert not (pending & used), f"a step reads or writes pages {sorted(pending & used)} before their copy landed"
        return launch(batch, *args, **kwargs)

    monkeypatch.setattr(llm.runner, "launch", checked_launch)
    assert conversations(llm) == baseline
    assert llm.core.cache.promoted_pages > 0 and llm.core.stats().host_hit_tokens > 0
    assert not any(seen)  # every launch found the queue empty: the core fenced first
    # the control: without the fence a launch does meet a queued copy of its own pages
    broken = engine(host_kv_cache_bytes=HOST_BYTES)
    broken.core.host_kv.delay_copies = True
    monkeypatch.setattr(broken.core, "_fence", lambda: None)
    host, launch = broken.core.host_kv, broken.runner.launch
    monkeypatch.setattr(broken.runner, "launch", checked_launch)
    with pytest.raises(Exception, match="before their copy landed"):
        conversations(broken)


def test_failed_loads_recompute_and_failed_demotions_drop(baseline, monkeypatch):
    llm = engine(host_kv_cache_bytes=HOST_BYTES)

    def fail(*_):
        raise RuntimeError("injected copy failure")

    monkeypatch.setattr(llm.core.host_kv, "promote", fail)
    assert conversations(llm) == baseline  # the host part is recomputed
    s = llm.core.stats()
    assert s.failed_copies > 0 and s.host_hit_tokens == 0 and s.bytes_h2d == 0
    assert llm.core.cache.num_host_pages > 0  # the blocks stay on host (another load may succeed)
    assert_no_leak(llm)

    llm = engine(host_kv_cache_bytes=HOST_BYTES)
    monkeypatch.setattr(llm.core.host_kv, "demote", fail)
    assert conversations(llm) == baseline  # eviction drops the blocks as without a tier
    s = llm.core.stats()
    assert s.failed_copies > 0 and s.host_pages_used == 0 and s.host_hit_tokens == 0
    assert_no_leak(llm)


def test_salts_stay_apart_and_events_name_the_tier():
    pub = QueuePublisher()
    llm = engine(host_kv_cache_bytes=HOST_BYTES, kv_events=pub)
    conversations(llm, salts=("tenant-a", "tenant-b"))
    cache = llm.core.cache
    assert set(cache.namespaces) <= {"tenant-a", "tenant-b"}
    events = pub.drain().events
    assert any(isinstance(e, BlockStored) and e.medium == MEDIUM_CPU for e in events)
    assert llm.core.stats().host_hit_tokens > 0
    # the same prompt under another salt hits nothing, on either tier
    rng = random.Random(0)
    first = [rng.randrange(5, 150) for _ in range(12)]
    o = llm.generate([first], SamplingParams(max_tokens=1, temperature=0.0, cache_salt="tenant-c"))[0]
    assert o.cached_tokens == 0
    assert_no_leak(llm)


@pytest.mark.parametrize("kw, match", [
    (dict(host_kv_cache_bytes=-1), "host_kv_cache_bytes must be >= 0, got -1"),
    (dict(host_kv_cache_bytes="lots"), "host_kv_cache_bytes must be an int"),
    (dict(hicache_ratio="x"), "hicache_ratio must be a number"),
    (dict(hicache_ratio=-1.0), "hicache_ratio must be a finite number > 0, got -1.0"),
    (dict(host_kv_cache_bytes=1 << 60), f"host_kv_cache_bytes={1 << 60}: .* more than this machine can pin"),
    (dict(host_kv_cache_bytes=10), "host_kv_cache_bytes=10 holds no KV page"),
    (dict(host_kv_cache_bytes=HOST_BYTES, enable_prefix_caching=False), "needs prefix caching"),
    (dict(host_kv_cache_bytes=HOST_BYTES, hicache_ratio=2.0), "not both"),
])
def test_bad_host_sizes_are_refused_by_name(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        engine(**kw)


def test_int4_pages_and_scales_come_back_exactly_and_the_window_forgets_loaded_pages(monkeypatch):
    """INT4 pages with their (scale, zero) pairs: without the recent-token window the tier's outputs equal the
    one-tier engine's; with it, every page a load writes loses its shadow mapping (KVWindow.forget: the next
    step fills it from the loaded bytes, as after any evicted mapping) and the window's invariants hold."""
    def make(**kw):
        return LLM(tiny_config("llama"), dtype="float32", kv_dtype="int4", device="cpu", page_size=16, num_pages=6,
                   **kw)

    plain = make(kv_window=0)
    tiered = make(kv_window=0, host_kv_cache_bytes=HOST_BYTES)
    assert conversations(tiered, convs=8) == conversations(plain, convs=8)
    assert tiered.core.stats().host_hit_tokens > 0

    llm = make(host_kv_cache_bytes=HOST_BYTES)
    window = llm.runner.attention.window
    assert window is not None and llm.core.host_kv.window is window
    forgot, forget = [], window.forget

    def spy(pages):
        mapped = [p for p in pages if p in window._map]
        forget(pages)
        assert all(int(window.shadow_of[p]) == window.scratch and p not in window._map for p in pages)
        forgot.extend(mapped)

    monkeypatch.setattr(window, "forget", spy)
    conversations(llm, convs=8)
    window.check_invariants()
    assert llm.core.stats().host_hit_tokens > 0 and forgot  # loads landed on pages whose old shadows were dropped
    assert_no_leak(llm)


def test_a_flush_that_raises_is_queued_again_at_the_next_fence(monkeypatch):
    """HostKV on its own: a batch whose transfer raises stays queued (with those after it) and the next fence
    copies it; both layouts move every byte of every layer tensor (FP8 pages and their scales here)."""
    import numpy as np
    import torch

    from radixkv.engine.kv_store import KVStore

    for layout in ("page", "layer"):
        kv = KVStore(2, 6, 4, 2, 8, "fp8_e4m3", "cpu")
        tensors = [*kv.k_cache, *kv.v_cache, *kv.k_scale, *kv.v_scale]
        for t in tensors:
            t.copy_(torch.randn(t.shape).to(t.dtype))
        want = [t.clone() for t in tensors]
        host = HostKV(kv, 5, layout)
        g, h = np.array([4, 0, 2]), np.array([3, 1, 0])
        host.demote(g, h)
        transfer, calls = host._transfer, []

        def flaky(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("no device memory for the staging")
            return transfer(*args, **kwargs)

        monkeypatch.setattr(host, "_transfer", flaky)
        with pytest.raises(RuntimeError, match="staging"):
            host.fence()
        assert host.pending_gpu_pages == {0, 2, 4}
        host.fence()
        assert not host.pending_gpu_pages
        for t in tensors:
            t[torch.as_tensor(g)] = torch.zeros_like(t[torch.as_tensor(g)])
        host.promote(h, g)
        host.fence()
        assert all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
                   for a, b in zip(tensors, want))
        assert host.bytes_d2h == host.bytes_h2d == 3 * host.page_bytes == 3 * kv.total_bytes // kv.num_pages


def test_a_prefix_evicted_reloaded_and_evicted_again_is_copied_device_to_host_once():
    """Two chats that do not fit the GPU pool together, turn by turn: each turn evicts the other chat's
    history to host, loads its own back and evicts it again. A block loaded back keeps its host copy, so its
    second GPU eviction copies nothing: every block is copied device-to-host once (one BlockStored CPU per
    block hash, bytes_d2h = those blocks' bytes) however often it leaves the GPU, with the GPU-only engine's
    tokens."""
    def chats(llm: LLM) -> list[list[int]]:
        rng = random.Random(1)
        hist = [[rng.randrange(5, 150) for _ in range(48)] for _ in range(2)]
        outs = []
        for _ in range(3):
            for c in range(2):
                o = llm.generate([hist[c]], GREEDY)[0]
                outs.append(o.token_ids)
                hist[c] = hist[c] + o.token_ids + [rng.randrange(5, 150) for _ in range(4)]
        return outs

    pub = QueuePublisher()
    llm = engine(host_kv_cache_bytes=HOST_BYTES, kv_events=pub)
    assert chats(llm) == chats(engine())
    times: dict[tuple[str, str | None, int], int] = {}
    for e in pub.drain().events:
        if isinstance(e, (BlockStored, BlockRemoved)):
            for h in e.block_hashes:
                key = (type(e).__name__, e.medium, h)
                times[key] = times.get(key, 0) + 1
    copied = [h for kind, medium, h in times if (kind, medium) == ("BlockStored", MEDIUM_CPU)]
    assert copied and all(times[("BlockStored", MEDIUM_CPU, h)] == 1 for h in copied)
    assert any(times.get(("BlockRemoved", MEDIUM_GPU, h), 0) >= 2 for h in copied)  # evicted, loaded, evicted
    cache, s = llm.core.cache, llm.core.stats()
    assert cache.demotes_saved > 0 and cache.promoted_pages > 0 and s.host_hit_tokens > 0
    assert s.bytes_d2h == len(copied) * llm.core.host_kv.page_bytes == cache.demoted_pages * llm.core.host_kv.page_bytes
    assert_no_leak(llm)


def test_a_fence_waits_only_for_copies_queued_since_the_last_one(monkeypatch):
    """HostKV.fence makes the compute stream wait on the copy stream's event only when a flush queued copies
    since the last fence (a CUDA copy stream faked on CPU: the waits are counted)."""
    import contextlib

    import numpy as np
    import torch

    from radixkv.engine.kv_store import KVStore

    class Stream:
        def __init__(self) -> None:
            self.waits = 0

        def wait_stream(self, other) -> None:
            pass

        def wait_event(self, event) -> None:
            self.waits += 1

    compute = Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    host = HostKV(KVStore(2, 6, 4, 2, 8, "fp16", "cpu"), 4)
    host._stream, host._event = Stream(), type("Event", (), {"record": lambda self, s: None})()
    host.fence()
    assert compute.waits == 0  # nothing queued yet
    host.demote(np.array([1, 2]), np.array([0, 1]))
    host.fence()
    host.fence()
    assert compute.waits == 1  # the second fence found nothing new
    host.promote(np.array([0]), np.array([3]))
    host.fence()
    assert compute.waits == 2 and not host.pending_gpu_pages


def test_admissions_planned_ahead_load_their_host_blocks_before_their_step(monkeypatch):
    """Async scheduling plans admissions in the step ahead, so host blocks are loaded while the step before
    runs: with every copy held back until a fence, no launch (ahead or not) meets a page whose copy is pending,
    and the tokens equal the synchronous GPU-only engine's (all conversations of a turn sent at once, a small
    step budget so they are admitted over several steps)."""
    def waves(llm: LLM) -> list[list[int]]:
        rng = random.Random(1)
        hist = [[rng.randrange(5, 150) for _ in range(12)] for _ in range(4)]
        outs = []
        for _ in range(3):
            for c, o in enumerate(llm.generate([h for h in hist], GREEDY)):
                outs.append(o.token_ids)
                hist[c] = hist[c] + o.token_ids + [rng.randrange(5, 150) for _ in range(6)]
        return outs

    want = waves(engine(max_num_batched_tokens=16))
    llm = engine(host_kv_cache_bytes=HOST_BYTES, async_scheduling=True, max_num_batched_tokens=16)
    host, core = llm.core.host_kv, llm.core
    host.delay_copies = True
    loaded_ahead = []  # host pages loaded by admissions in a step ahead
    schedule_ahead = core.scheduler.schedule_ahead

    def counted(now):
        before = core.cache.promoted_pages
        batch = schedule_ahead(now)
        loaded_ahead.append(core.cache.promoted_pages - before)
        return batch

    def checked(real):
        def call(batch, *args, **kwargs):
            used = {p for row in batch.page_tables for p in row}
            assert not (host.pending_gpu_pages & used), "a step reads pages before their copy landed"
            return real(batch, *args, **kwargs)
        return call

    monkeypatch.setattr(core.scheduler, "schedule_ahead", counted)
    monkeypatch.setattr(llm.runner, "launch", checked(llm.runner.launch))
    monkeypatch.setattr(llm.runner, "forward", checked(llm.runner.forward))
    assert waves(llm) == want
    assert sum(loaded_ahead) > 0 and core.stats().host_hit_tokens > 0
    assert_no_leak(llm)
