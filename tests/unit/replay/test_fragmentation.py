"""Live-token fraction at peak (issue 18 item 5) on hand-made traces whose fractions are counted by hand."""
from __future__ import annotations

import json

import numpy as np
import pytest
from radixkv.workloads.traces import TraceRequest

from radixkv import Policy, SchedulerConfig
from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.cli import main
from radixkv.replay.cost_model import CostModel
from radixkv.replay.fragmentation import Fragmentation
from radixkv.replay.replay import ReplayConfig, replay_sequential
from radixkv.replay.simulator import _fresh_copy, run_scheduler, simulate
from radixkv.request import Request
from radixkv.scheduler.scheduler import Scheduler

SCHED = SchedulerConfig(policy=Policy.FCFS, max_running=8)


def _sim(reqs: list[Request], page_size: int, num_pages: int = 64):
    r = simulate(reqs, num_pages, page_size, SCHED, CostModel())
    assert r.completed == len(reqs) and r.leaked_pages == 0
    return r


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_page_size_one_is_always_full(max_tokens):
    r = _sim([Request(0, list(range(17)), max_tokens)], 1)
    assert r.as_json()["live_token_fraction"] == 1.0


def test_seventeen_tokens_on_page_sixteen():
    # step 1 prefills 17 tokens into 2 pages (block 1 cached, 1 token in the tail): 17 / 32, the
    # peak (step 2 decodes the 18th token into the tail page and finishes). Contiguous: 17 + 2
    # reserved, 17 held after step 1 (18 after step 2, same reservation: the first step counts).
    r = _sim([Request(0, list(range(17)), 2)], 16)
    f = r.fragmentation
    assert (r.peak_pages, f.peak_pages, f.live_tokens) == (2, 2, 17)
    assert f.live_token_fraction == 17 / 32
    assert (f.contiguous_reserved, f.contiguous_live) == (19, 17)
    assert f.contiguous_live_fraction == 17 / 19


def test_one_step_request_counts_in_the_contiguous_baseline():
    # max_tokens=1 finishes in its only step: it held 17 + 1 reserved with 17 tokens computed; the
    # paged peak (after release) is the cached full block alone.
    f = _sim([Request(0, list(range(17)), 1)], 16).fragmentation
    assert (f.peak_pages, f.live_tokens, f.contiguous_reserved, f.contiguous_live) == (1, 16, 18, 17)


def test_shared_prefix_is_counted_once():
    # A = 10 tokens, 3 outputs, page 4: step 1 holds 3 pages with 10 tokens (2 blocks cached + 2 in
    # the tail); A finishes with 12 computed tokens = 3 cached blocks. B (arrives later) shares A's
    # 8-token prefix: after its step 1 the tree holds 3 full pages and B 1 private token: 13 / 16,
    # the peak (4 pages). Contiguous: A's 13 reserved with 10 held is the first peak (B reserves 12).
    a = Request(0, list(range(1, 11)), 3, arrival_s=0.0)
    b = Request(1, list(range(1, 9)) + [20], 3, arrival_s=1000.0)
    r = _sim([a, b], 4)
    f = r.fragmentation
    assert r.hit_tokens == 8 and r.peak_pages == f.peak_pages == 4
    assert f.live_tokens == 13 and f.live_token_fraction == 13 / 16
    assert f.contiguous_live_fraction == 10 / 13


def test_concurrent_requests_sum_in_both_allocators():
    # Two disjoint 5-token prompts, 4 outputs each, page 4, admitted together. After step 1 each
    # holds 1 cached block + 1 token in a tail page: 10 / 16 on 4 pages. Step 2: 6 tokens each,
    # 4 pages still (not a new peak); step 3 (7 tokens each) the same; step 4 finishes both at 8
    # computed, 2 cached blocks each: 4 pages, full. Contiguous: 2 x 9 reserved, 10 held first.
    reqs = [Request(0, [1, 2, 3, 4, 5], 4), Request(1, [6, 7, 8, 9, 10], 4)]
    f = _sim(reqs, 4).fragmentation
    assert (f.peak_pages, f.live_tokens) == (4, 10)
    assert (f.contiguous_reserved, f.contiguous_live) == (18, 10)


def test_live_tokens_match_the_pages_at_every_step():
    # Under pressure (preemption, eviction): pages in use are exactly the tree's pages plus each
    # running request's private pages, ceil((computed - locked) / page_size) of them.
    reqs = [Request(i, [i % 3 * 1000 + j for j in range(40)] + [5000 + i] * (i % 7), 6 + i % 5,
                    arrival_s=0.001 * i) for i in range(40)]
    pool = PagePool(30)
    cache = RadixCache(pool, page_size=4)
    sched = Scheduler(pool, cache, SchedulerConfig(policy=Policy.LPM, max_running=8), 4)
    frag = Fragmentation(4)
    checked = [0]

    def after(done: list[Request]) -> None:
        private = sum(-(-(e.req.num_computed - e.locked.num_tokens) // 4) for e in sched.running)
        assert pool.num_used == cache.num_cached_pages + private
        frag.observe(sched, done)
        checked[0] += 1

    run_scheduler(sched, [_fresh_copy(r, r.arrival_s) for r in reqs], CostModel().step_seconds, after_update=after)
    assert sched.metrics.preemptions > 0 and checked[0] == sched.metrics.steps
    assert frag.peak_pages == sched.metrics.peak_pages == 30
    assert 0.9 < frag.live_token_fraction <= 1.0 and 0 < frag.contiguous_live_fraction < 1.0


def test_sequential_tail_page():
    # one request alone: its block cached and 1 token in a private tail page: 17 / 32; contiguous
    # reserves 17 + 3 and holds the prompt (sequential replay computes prompts only)
    r = replay_sequential([TraceRequest(0.0, np.arange(17, dtype=np.int32), 3)], ReplayConfig(page_size=16, sequential=True),
                          CostModel())
    assert r.live_token_fraction == 17 / 32 and r.contiguous_live_fraction == 17 / 20
    r1 = replay_sequential([TraceRequest(0.0, np.arange(17, dtype=np.int32), 3)], ReplayConfig(page_size=1, sequential=True),
                           CostModel())
    assert r1.live_token_fraction == 1.0


@pytest.mark.parametrize("extra", [[], ["--sequential"]])
def test_replay_json_has_the_fraction_keys(tmp_path, capsys, extra):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"tokens": list(range(17)), "max_tokens": 2, "arrival_s": 0.0}) + "\n")
    js = tmp_path / "r.json"
    assert main(["replay", str(trace), "--page-size", "16", "--no-progress", "--json", str(js)] + extra) == 0
    d = json.loads(js.read_text())
    want = 17 / 32
    assert d["live_token_fraction"] == want
    assert d["contiguous_live_fraction"] == 17 / 19
    assert "live tokens at peak" in capsys.readouterr().out
