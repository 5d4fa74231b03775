"""`radixkv replay --replicas N --router ...`: the fleet's JSON keys, the plain replay's left as they were,
and clear errors for flag combinations it cannot run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixkv.cli import main
from radixkv.workloads.traces import TraceRequest, write_trace

FLEET_KEYS = {"replicas", "router", "per_replica_hit_rate", "load_max_over_mean", "per_replica_requests"}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 requests of 3 groups sharing 64-token prefixes, one a second, in a rotating group order."""
    path = tmp_path_factory.mktemp("fleet") / "groups.jsonl"
    reqs = [TraceRequest(float(i), np.asarray([7 + (i + i // 3) % 3] * 64 + [i] * 9, dtype=np.int32), 4)
            for i in range(24)]
    write_trace(path, reqs)
    return path


def run(trace: Path, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "out.json"
    assert main(["replay", str(trace), "--simulate", "--num-pages", "64", "--no-progress", "--json", str(out),
                 *flags]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("router", ["prefix", "round-robin", "least-loaded"])
def test_replicas_json_adds_the_fleet_keys(trace, tmp_path, router, capsys):
    d = run(trace, tmp_path, "--replicas", "3", "--router", router)
    plain = run(trace, tmp_path)
    assert set(d) == set(plain) | FLEET_KEYS
    assert d["replicas"] == 3 and d["router"] == router
    assert len(d["per_replica_hit_rate"]) == 3 and sum(d["per_replica_requests"]) == 24
    assert d["load_max_over_mean"] == max(d["per_replica_requests"]) / 8
    assert d["completed"] == 24 and d["leaked_pages"] == 0 and d["num_pages"] == 64
    assert "router " + router in capsys.readouterr().out


def test_prefix_router_beats_round_robin_on_shared_prefixes(trace, tmp_path):
    prefix = run(trace, tmp_path, "--replicas", "3", "--router", "prefix")
    rr = run(trace, tmp_path, "--replicas", "3", "--router", "round-robin")
    assert prefix["hit_rate"] > rr["hit_rate"]
    assert run(trace, tmp_path, "--replicas", "3")["router"] == "prefix"  # the default router


def test_one_replica_is_the_plain_replay(trace, tmp_path):
    plain = run(trace, tmp_path)
    one = run(trace, tmp_path, "--replicas", "1", "--router", "round-robin")
    assert set(one) == set(plain)
    assert {k: v for k, v in one.items() if k != "wall_s"} == {k: v for k, v in plain.items() if k != "wall_s"}


@pytest.mark.parametrize("flags, message", [
    (["--router", "prefix"], "--router prefix needs --replicas N"),
    (["--replicas", "2", "--sequential"], "excludes --sequential"),
    (["--replicas", "2", "--model", "some-model"], "excludes --model"),
    (["--replicas", "2", "--plot", "x.png"], "--plot draws one cache's timeline"),
])
def test_bad_flag_combinations_are_refused(trace, flags, message, capsys):
    assert main(["replay", str(trace), "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--replicas", "0"], ["--replicas", "2", "--router", "random"]])
def test_bad_flag_values_are_usage_errors(trace, flags, capsys):
    with pytest.raises(SystemExit) as e:
        main(["replay", str(trace), "--no-progress", *flags])
    assert e.value.code == 2
    assert flags[-2] in capsys.readouterr().err
