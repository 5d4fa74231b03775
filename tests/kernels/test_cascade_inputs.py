"""The static cascade plan a CUDA graph replays (radixkv/engine/cascade_inputs.py), filled for one step and
padded to a bucket: cascade_decode over its views equals paged_decode over the whole page tables (the
interpreter runs the Triton kernels), padding rows and groups included, and refilling for another step
in the same buffers leaves nothing stale that the kernels read."""
from __future__ import annotations

import torch

from radixkv.engine.cascade_inputs import MAX_GROUPS, CascadeGraphKey, CascadeInputs, CascadeKey
from radixkv.kernels import paged_decode
from radixkv.kernels.cascade import cascade_decode

from test_cascade import _batch, _caches, _close, _dense_table, _gen

I32 = torch.int32


def _step(inputs, turn, bucket, groups, lone, ps, gen, kc, vc, num_pages):
    tables, lens, spec, _ = _batch(groups, lone, ps, gen)
    assert max(max(t) for t in tables) < num_pages - 1
    key = inputs.fill(turn, bucket, spec, tables, lens)
    inputs.upload(turn, bucket)
    plan = inputs.plan(bucket, CascadeGraphKey(key.groups, 2, 1))  # the splits a graph freezes
    B = len(lens)
    q = torch.randn(bucket, 4, 16, generator=gen, dtype=torch.float32)
    out = cascade_decode(q, kc, vc, plan)
    ref = paged_decode(q[:B], kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32))
    _close(out[:B], ref, 1e-5)
    return key


def test_static_plan_equals_paged_decode_across_refills():
    ps, num_pages = 4, 96
    gen = _gen("cascade-inputs")
    kc, vc, _, _ = _caches(num_pages, ps, 2, 16, "fp32", gen)
    inputs = CascadeInputs(max_rows=12, max_pages=16, page_size=ps, scratch_page=num_pages - 1,
                           device=torch.device("cpu"))
    key = _step(inputs, 0, 8, [(3, 3), (2, 1), (1, 2)], 1, ps, gen, kc, vc, num_pages)
    assert key == CascadeKey(groups=4, group_rows=8, prefix_pages=4, suffix_len=key.suffix_len)
    # the other buffer, then the first again with fewer groups: padding groups hide the stale ones
    _step(inputs, 1, 12, [(4, 2), (5, 5)], 2, ps, gen, kc, vc, num_pages)
    key = _step(inputs, 0, 4, [(2, 2)], 1, ps, gen, kc, vc, num_pages)
    assert key.groups == 1 and key.group_rows == 4


def test_more_groups_than_the_buffers_do_not_fit():
    inputs = CascadeInputs(max_rows=4, max_pages=4, page_size=4, scratch_page=0, device=torch.device("cpu"))
    assert inputs.fits([([0, 1], 4)] * MAX_GROUPS) and not inputs.fits([([0, 1], 4)] * (MAX_GROUPS + 1))
    assert not inputs.fits([])


# ----------------------------------------------------------------------------- start-up warm-up
class _Recorder:
    """Stands in for launch.for_device in kernels/cascade.py: runs each kernel and records what Triton
    compiles a launch for (its own specialisation rule: an int == 1 becomes a constant, ints and pointers
    divisible by 16 get a hint, unless do_not_specialize), with the constexprs."""

    def __init__(self):
        self.seen: set[tuple] = set()

    def __call__(self, kernel, device):
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import native_specialize_impl

        def launch(grid):
            def run(*args, **constexprs):
                dns = set(kernel.kwargs["do_not_specialize"] or ())
                spec = tuple(native_specialize_impl(BaseBackend, a, False, name not in dns, True)
                             for name, a in zip(kernel.arg_names, args))
                self.seen.add((kernel.fn.__name__, spec, tuple(sorted(constexprs.items()))))
                return kernel[grid](*args, **constexprs)
            return run

        return type("Launcher", (), {"__getitem__": lambda _, grid: launch(grid)})()


def test_startup_warm_keys_cover_every_step_and_compile_every_specialisation(monkeypatch):
    """DecodeGraphs.warm_cascade's keys and its eager runs on padding rows (here without the model): every
    step a rule lets through maps to a warmed graph key (no capture on first use), and the kernels it
    launches need no specialisation the warm-up did not compile. The prefix and merge kernels compile once
    for all split counts; only the suffix decode has one per split class."""
    import types

    from radixkv.engine.attention import Backend, PagedAttention
    from radixkv.engine.cuda_graphs import DecodeGraphs
    from radixkv.engine.kv_store import KVStore
    from radixkv.kernels import cascade

    ps, num_pages, W = 16, 40, 32  # up to 512 tokens a row: 1 or 2 prefix splits, 1-8 suffix ones (64 tokens each)
    kv = KVStore(1, num_pages, ps, 2, 16, "fp32", "cpu")
    graphs = types.SimpleNamespace(attention=PagedAttention(kv, 4, 16, 0.25, Backend.TRITON), max_pages=W,
                                   cascade_buckets=[1, 2, 4, 8])
    graphs.cascade_graph_key = lambda b, k: DecodeGraphs.cascade_graph_key(graphs, b, k)
    graphs.widened_prefix_pages = lambda g: DecodeGraphs.widened_prefix_pages(graphs, g)  # fp32 pages: 0
    warm = DecodeGraphs.cascade_warm_keys(graphs, min_rows=2, min_prefix_tokens=2 * ps)
    assert {(k.prefix_splits, k.suffix_splits) for _, k in warm} == {(p, s) for p in (1, 2) for s in (1, 2, 4, 8)}
    assert len(warm) == len(set(warm)) <= 64  # warm_cascade's limit: all captured at start-up

    gen = _gen("warm")
    kc, vc = kv.k_cache[0], kv.v_cache[0]
    kc.copy_(torch.randn(kc.shape, generator=gen))
    vc.copy_(torch.randn(vc.shape, generator=gen))
    inputs = CascadeInputs(8, W, ps, num_pages - 1, torch.device("cpu"))
    rec = _Recorder()
    monkeypatch.setattr(cascade, "for_device", rec)
    firsts = {}  # warm_cascade's loop body, the model's attention only, once per split pair (the cheapest key)
    for bucket, key in warm:
        firsts.setdefault((key.prefix_splits, key.suffix_splits), (bucket, key))
    for bucket, key in firsts.values():
        inputs.fill_padding(0, bucket)
        inputs.upload(0, bucket)
        out = cascade_decode(torch.randn(bucket, 4, 16, generator=gen), kc, vc, inputs.plan(bucket, key))
        assert torch.isfinite(out).all()
    warmed = set(rec.seen)
    per_kernel = {name: sum(s[0] == name for s in warmed) for name, _, _ in warmed}
    assert per_kernel == {"_prefix_kernel": 1, "_merge_kernel": 1, "_decode_kernel": 2}  # suffix splits 1 and 2

    keys = {k for _, k in warm}
    for groups, lone, bucket in (([(2, 2)], 0, 2), ([(3, 17), (2, 5)], 1, 8), ([(2, 9), (2, 3), (2, 2)], 0, 8)):
        tables, lens, spec, _ = _batch(groups, lone, ps, gen)
        shape = inputs.fill(1, bucket, spec, tables, lens)
        key = graphs.cascade_graph_key(bucket, shape)
        assert (bucket, key) in warm and key in keys  # a graph warm_cascade captured
        inputs.upload(1, bucket)
        q = torch.randn(bucket, 4, 16, generator=gen)
        out = cascade_decode(q, kc, vc, inputs.plan(bucket, key))
        _close(out[:len(lens)], paged_decode(q[:len(lens)], kc, vc, _dense_table(tables),
                                             torch.tensor(lens, dtype=I32)), 1e-5)
    assert rec.seen == warmed  # nothing new to compile


def test_fp8_graphs_read_a_narrow_prefix_table_widened_to_copies(monkeypatch):
    """Over FP8 pages a graph key takes a prefix table as wide as the groups' fp16 copies fit (the graphs'
    16-bit logits and the widen budget, a power of two of pages); a step whose prefixes fit it replays that
    graph, which widens the prefixes (dequant_pages) and equals paged_decode; a longer prefix gets width 0
    (the whole table: its plan never widens, whatever the caller's budget, in-kernel FP8)."""
    import types

    import radixkv.kernels.cascade as cascade_mod
    from radixkv.engine.attention import Backend, PagedAttention
    from radixkv.engine.cuda_graphs import DecodeGraphs
    from radixkv.engine.kv_store import KVStore

    ps, num_pages, W, hkv, d = 4, 64, 32, 2, 16
    kv = KVStore(1, num_pages, ps, hkv, d, "fp8_e4m3", "cpu", compute_dtype=torch.float16)
    att = PagedAttention(kv, 4, d, 0.25, Backend.TRITON)
    # copies of a page: 2 x 4 x 2 x 16 x 2 = 512 bytes; logits 8 rows x 256 x 2 = 4 KiB: 8 pages for one group
    graphs = types.SimpleNamespace(attention=att, max_pages=W, max_rows=8, model=types.SimpleNamespace(vocab_rows=256))
    assert [DecodeGraphs.widened_prefix_pages(graphs, g) for g in (1, 2, 4, 8)] == [8, 4, 2, 1]
    att.widen_max_bytes = 1024  # the widen budget bounds it too
    assert DecodeGraphs.widened_prefix_pages(graphs, 1) == 2
    att.widen_max_bytes = None
    graphs.widened_prefix_pages = lambda g: DecodeGraphs.widened_prefix_pages(graphs, g)

    gen = _gen("fp8-narrow")
    kc, vc, ks, vs = _caches(num_pages, ps, hkv, d, "fp8_e4m3", gen)
    inputs = CascadeInputs(8, W, ps, num_pages - 1, torch.device("cpu"))
    widened = []
    real = cascade_mod.dequant_pages
    monkeypatch.setattr(cascade_mod, "dequant_pages", lambda *a: widened.append(a[4].shape) or real(*a))
    for groups, width in (([(3, 3), (2, 4)], 4), ([(3, 9), (2, 2)], 0)):
        tables, lens, spec, _ = _batch(groups, 1, ps, gen)
        shape = inputs.fill(0, 8, spec, tables, lens)
        key = DecodeGraphs.cascade_graph_key(graphs, 8, shape)
        assert key.prefix_width == width
        inputs.upload(0, 8)
        plan = inputs.plan(8, key)
        assert plan.groups.prefix_pages.shape == (2, width or W)
        q = torch.randn(8, 4, d, generator=gen).half()
        widened.clear()
        out = cascade_decode(q, kc, vc, plan, k_scale=ks, v_scale=vs, widen_max_bytes=1 << 30)  # the plan bounds it
        assert widened == ([(2, width)] if width else [])
        ref = paged_decode(q[:len(lens)], kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32), k_scale=ks,
                           v_scale=vs)
        _close(out[:len(lens)], ref, 2e-3)
