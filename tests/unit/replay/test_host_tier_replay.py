"""`radixkv replay --host-pages N` (issue 37): the simulated host tier, its cost and its refusals."""
from __future__ import annotations

import pytest

from radixkv.replay.cost_model import CostModel
from radixkv.replay.replay import ReplayConfig, run_replay
from radixkv.workloads.traces import TraceRequest


def trace() -> list[TraceRequest]:
    # three prompts sharing nothing, then each again: a 2-prompt GPU pool forgets the first
    prompts = [list(range(i * 1000, i * 1000 + 64)) for i in range(3)]
    return [TraceRequest(prompt=p, max_tokens=2, arrival_s=float(k)) for k, p in enumerate(prompts * 2)]


@pytest.mark.parametrize("sequential", [True, False])
def test_host_tier_turns_recompute_into_loads(sequential):
    reqs = trace()
    base = run_replay(reqs, ReplayConfig(num_pages=10, sequential=sequential, concurrency=1))
    tier = run_replay(reqs, ReplayConfig(num_pages=10, sequential=sequential, concurrency=1, host_pages=16))
    unl = run_replay(reqs, ReplayConfig(sequential=sequential, concurrency=1))
    assert tier.hit_rate > base.hit_rate
    assert tier.hit_rate == pytest.approx(unl.hit_rate)
    assert tier.host_hit_tokens > 0 and tier.gpu_hit_tokens + tier.host_hit_tokens == tier.hit_tokens
    assert tier.bytes_h2d == tier.host_hit_tokens * CostModel().kv_bytes_per_token and tier.bytes_d2h > 0
    assert tier.leaked_pages == 0
    assert base.host_pages is None and base.host_hit_tokens == 0


def test_transfer_seconds():
    c = CostModel(kv_bytes_per_token=100.0, pcie_bytes_per_s=1e3)
    assert c.transfer_seconds(20) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="pcie_bytes_per_s"):
        CostModel(pcie_bytes_per_s=0)


@pytest.mark.parametrize("bad", [-5, 2**31])
def test_replay_config_refuses_host_pages(bad):
    with pytest.raises(ValueError, match=f"{bad:,}"):
        ReplayConfig(host_pages=bad)


@pytest.mark.parametrize("bad,says", [("-3", "got -3"), ("99999999999", "got 99,999,999,999"), ("1e9", "'1e9'")])
def test_cli_refuses_host_pages(bad, says, capsys):
    from radixkv.cli import main

    with pytest.raises(SystemExit) as e:
        main(["replay", "--host-pages", bad, "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--host-pages" in err and says in err
