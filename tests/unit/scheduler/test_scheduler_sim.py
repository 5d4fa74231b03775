"""Simulator and cost model tests, including the issue's "done when" on a shared-prefix burst."""
from __future__ import annotations

import random

import pytest

from radixkv import Policy, SchedulerConfig
from radixkv.batch import Batch
from radixkv.replay.cost_model import CostModel, StepShape
from radixkv.request import Request, Status
from radixkv.replay.simulator import fake_token, simulate


def shared_prefix_requests(groups: int, n: int, prefix: int, suffix: int, out: int,
                           seed: int = 0) -> list[Request]:
    """n requests cycling over `groups` system prompts of `prefix` tokens + a random suffix."""
    rng = random.Random(seed)
    return [Request(i, [i % groups * 100_000 + j for j in range(prefix)]
                    + [rng.randrange(50_000, 60_000) for _ in range(suffix)], out,
                    arrival_s=0.01 * i)
            for i in range(n)]


@pytest.mark.parametrize("match_budget", [256, 8])  # every candidate re-matched, or 8 a round
def test_lpm_beats_fcfs_on_a_shared_prefix_burst_into_a_small_pool(match_budget):
    # 12 prompts of 32 pages each cannot all stay cached in 250 pages: fcfs cycles through the
    # groups and evicts each prefix before its next user comes; lpm serves cached groups first.
    reqs = shared_prefix_requests(groups=12, n=192, prefix=512, suffix=32, out=16)
    cfg = dict(max_running=64, match_budget=match_budget)  # --concurrency 64
    fcfs = simulate(reqs, 250, 16, SchedulerConfig(policy=Policy.FCFS, **cfg), CostModel(), burst=True)
    lpm = simulate(reqs, 250, 16, SchedulerConfig(policy=Policy.LPM, **cfg), CostModel(), burst=True)
    for r in (fcfs, lpm):
        assert r.completed == r.requests == 192 and r.leaked_pages == 0
        assert r.peak_pages <= 250
    assert lpm.hit_rate > fcfs.hit_rate + 0.3
    assert lpm.wait_max_s <= 2 * fcfs.wait_max_s
    assert lpm.outputs == fcfs.outputs  # same tokens generated whatever the order


@pytest.mark.parametrize("burst", [True, False])
@pytest.mark.parametrize("num_pages", [40, 80, 120, 400])  # 6 prefixes need 96 pages
def test_lpm_hit_rate_is_never_below_fcfs_on_shared_prefixes(num_pages, burst):
    reqs = shared_prefix_requests(groups=6, n=96, prefix=256, suffix=16, out=8)
    res = {p: simulate(reqs, num_pages, 16, SchedulerConfig(policy=p, max_running=16), CostModel(),
                       burst=burst) for p in (Policy.FCFS, Policy.LPM)}
    fcfs, lpm = res[Policy.FCFS], res[Policy.LPM]
    assert lpm.completed == fcfs.completed == 96 and lpm.leaked_pages == fcfs.leaked_pages == 0
    assert lpm.hit_rate >= fcfs.hit_rate
    assert lpm.wait_max_s <= 2 * fcfs.wait_max_s
    if num_pages < 96:  # the prefixes do not all fit: ordering matters
        assert lpm.hit_rate > fcfs.hit_rate + 0.3


@pytest.mark.parametrize("policy", list(Policy))
def test_simulate_completes_everything_and_leaves_inputs_untouched(policy):
    reqs = shared_prefix_requests(groups=3, n=30, prefix=40, suffix=9, out=5)
    seen: list[int] = []
    r = simulate(reqs, 24, 8, SchedulerConfig(policy=policy, max_running=8, max_batch_tokens=64),
                 CostModel(), progress=seen.append)
    assert r.completed == 30 and r.leaked_pages == 0
    assert r.outputs == {q.rid: [fake_token(q.rid, i) for i in range(5)] for q in reqs}
    assert seen == sorted(seen) and seen[-1] == 30
    assert all(q.status is Status.WAITING and q.output == [] and q.pages == [] for q in reqs)
    assert 0.0 <= r.wait_p50_s <= r.wait_p99_s <= r.wait_max_s
    assert len(r.timeline) == r.steps and r.timeline[-1].now == pytest.approx(r.sim_seconds)
    keys = {"requests", "completed", "prompt_tokens", "hit_tokens", "hit_rate", "peak_pages",
            "preemptions", "wait_p50_s", "wait_p99_s", "wait_max_s", "leaked_pages", "sim_seconds"}
    assert keys <= set(r.as_json())


def test_burst_queues_everyone_at_time_zero():
    reqs = [Request(i, [i] * 20, 4, arrival_s=10.0 * i) for i in range(6)]
    cfg = SchedulerConfig(max_running=1)
    spread = simulate(reqs, 64, 4, cfg, CostModel())
    burst = simulate(reqs, 64, 4, cfg, CostModel(), burst=True)
    assert spread.wait_max_s == 0.0  # each finishes long before the next arrives
    assert spread.sim_seconds > 50.0  # the clock jumped to the last arrival
    assert burst.wait_max_s > 0.0 and burst.sim_seconds < 1.0


def test_simulate_refuses_a_request_larger_than_the_pool():
    with pytest.raises(ValueError, match="request 1 needs up to 6 pages"):
        simulate([Request(0, [1], 1), Request(1, list(range(20)), 4)], 5, 4,
                 SchedulerConfig(), CostModel())
    with pytest.raises(ValueError, match="distinct"):
        simulate([Request(0, [1], 1), Request(0, [2], 1)], 5, 4, SchedulerConfig(), CostModel())


def test_cost_model_prices_each_term():
    # row 0: prefill chunk of 3 tokens over 5; row 1: a decode over 9 tokens
    batch = Batch(requests=[], input_ids=[0] * 4, positions=[2, 3, 4, 8], q_start=[0, 3],
                  q_lens=[3, 1], seq_lens=[5, 9], page_tables=[[0, 1], [2, 3, 4]],
                  slots=[2, 3, 4, 8], sample=[True, True], page_size=2)
    assert StepShape.of(batch) == StepShape(prefill_tokens=3, decode_tokens=1, kv_tokens_read=14,
                                            attention_pairs=15)
    m = CostModel(base_s=1.0, prefill_token_s=10.0, decode_token_s=100.0, kv_read_token_s=1000.0,
                  attn_pair_s=10000.0)
    assert m.step_seconds(batch) == 1.0 + 30.0 + 100.0 + 14000.0 + 150000.0
    d = CostModel()
    assert 1e-3 < d.base_s < 1e-2 and d.prefill_token_s > d.kv_read_token_s > 0
    with pytest.raises(ValueError, match="decode_token_s"):
        CostModel(decode_token_s=-1.0)
