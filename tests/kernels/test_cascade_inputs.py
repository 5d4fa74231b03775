"""The static cascade plan a CUDA graph replays (radixkv/engine/cascade_inputs.py), filled for one step and
padded to a bucket: cascade_decode over its views equals paged_decode over the whole page tables (the
interpreter runs the Triton kernels), padding rows and groups included, and refilling for another step
in the same buffers leaves nothing stale that the kernels read."""
from __future__ import annotations

import torch

from radixkv.engine.cascade_inputs import MAX_GROUPS, CascadeInputs, CascadeKey
from radixkv.kernels import paged_decode
from radixkv.kernels.cascade import cascade_decode

from test_cascade import _batch, _caches, _close, _dense_table, _gen

I32 = torch.int32


def _step(inputs, turn, bucket, groups, lone, ps, gen, kc, vc, num_pages):
    tables, lens, spec, _ = _batch(groups, lone, ps, gen)
    assert max(max(t) for t in tables) < num_pages - 1
    key = inputs.fill(turn, bucket, spec, tables, lens)
    inputs.upload(turn, bucket)
    plan = inputs.plan(bucket, key)
    B = len(lens)
    q = torch.randn(bucket, 4, 16, generator=gen, dtype=torch.float32)
    out = cascade_decode(q, kc, vc, plan, prefix_splits=2)
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
