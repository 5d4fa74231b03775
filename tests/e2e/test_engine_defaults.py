"""The engine's decided defaults reach every reader (issue 31 item 3): on CPU an LLM without max_num_seqs keeps
256 and cascade off, with them given keeps the given values; the runner, the EngineCore's Scheduler, the warm-up
and the start-up line read one decided config (`runner.config`), also when the decision is not 256."""
from __future__ import annotations

import pytest

import radixkv.config
from radixkv import LLM, SamplingParams
from radixkv.engine.warmup import _Warmup, startup_lines

from .tiny_models import tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _seen(llm: LLM) -> tuple[int, bool]:
    """(max_running, cascade) of the config every part reads, after checking they agree."""
    runner_cfg = llm.runner.config
    assert llm.config is runner_cfg and llm.core.config is runner_cfg
    assert llm.core.scheduler.config == runner_cfg.scheduler
    assert _Warmup(llm.core).max_rows == runner_cfg.scheduler.max_running
    return runner_cfg.scheduler.max_running, runner_cfg.scheduler.cascade


def test_cpu_without_max_num_seqs_keeps_256_and_cascade_off() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", num_pages=64)
    assert (llm.config.auto_max_num_seqs, llm.config.auto_cascade) == (True, True)
    assert _seen(llm) == (256, False)
    assert "max_num_seqs 256 (engine default from the KV pool); cascade decode off (engine default)" in \
        startup_lines(llm.core, None)[1]


@pytest.mark.parametrize("kw, want", [({"max_num_seqs": 3}, (3, False)), ({"max_running": 300}, (300, False)),
                                      ({"max_num_seqs": 5, "cascade": True}, (5, True)),
                                      ({"cascade": False}, (256, False))])
def test_given_values_are_kept(kw: dict, want: tuple[int, bool]) -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", num_pages=64, **kw)
    assert _seen(llm) == want


def test_explicit_cascade_on_cpu_still_runs() -> None:
    """cascade=True on the CPU reference backend is respected (the reference cascade twins run it)."""
    llm = LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=256, cascade=True)
    assert _seen(llm) == (256, True)
    assert len(llm.generate([[5] * 30 + [i] for i in range(3, 7)], GREEDY)) == 4


@pytest.mark.parametrize("kv_dtype", ["fp32", "int4"])
def test_a_decided_value_reaches_the_scheduler_window_and_warm_up(monkeypatch, kv_dtype: str) -> None:
    """Pretend the pool decided 12 rows (CUDA's rule cannot run here): the scheduler admits at most 12, the
    window (INT4 pages) holds shadow pages for 12, the warm-up and the start-up line say 12."""
    monkeypatch.setattr(radixkv.config, "engine_max_running", lambda *a: 12)
    llm = LLM(tiny_config("llama"), dtype="float32", kv_dtype=kv_dtype, page_size=16, num_pages=512)
    assert _seen(llm) == (12, False)
    assert "max_num_seqs 12 (engine default from the KV pool)" in startup_lines(llm.core, None)[1]
    window = llm.runner.attention.window
    if kv_dtype == "int4":
        given = LLM(tiny_config("llama"), dtype="float32", kv_dtype=kv_dtype, page_size=16, num_pages=512,
                    max_num_seqs=12).runner.attention.window
        assert window.capacity == given.capacity
    else:
        assert window is None
    reqs = llm.add_requests([[7, i, 9, 11] for i in range(3, 23)], GREEDY)
    llm.step()
    assert sum(r.num_computed > 0 for r in reqs) == 12  # admission stops at the decided running set
    while llm.has_work():
        llm.step()
    assert all(len(r.output) == 4 for r in reqs)
