"""Warm before ready (issue 31 item 1): warm_up drives the engine through its shapes and leaves no trace
(stats at zero, every page back in the pool, the tree empty and sound) and no effect on what a request
generates; it is off on CPU unless asked; the start-up lines are logged at info; Triton's cache goes to
radixkv's cache folder. CPU, tiny models (the reference attention: what is compiled is the GPU's story)."""
from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from radixkv import LLM, SamplingParams
from radixkv.config import EngineConfig
from radixkv.engine.warmup import (
    WarmupReport,
    startup_lines,
    use_radixkv_triton_cache,
    warm_up,
)

from .tiny_models import tiny_config

SMALL = {"max_num_seqs": 8, "num_pages": 256}
PROMPTS = [[5, 9, 33, 71, 2, 8, 100, 41, 7], list(range(10, 60)), [3] * 37]
PARAMS = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=8, temperature=0.9, top_p=0.8, seed=11, ignore_eos=True),
          SamplingParams(max_tokens=8, temperature=0.7, seed=5, logprobs=2, ignore_eos=True)]


def _outputs(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


def _assert_untouched(llm: LLM) -> None:
    s = llm.core.stats()
    assert (s.num_running, s.num_waiting, s.pages_used) == (0, 0, 0)
    assert (s.prompt_tokens, s.hit_tokens, s.preemptions, s.num_steps, s.mixed_steps) == (0, 0, 0, 0, 0)
    assert llm.core.steps_ahead == 0
    m = llm.core.scheduler.metrics
    assert (m.completed, m.steps, m.peak_pages, m.waits_s, m.timeline) == (0, 0, 0, [], [])
    assert llm.core.pool.num_free == llm.core.pool.num_pages
    assert llm.core.cache.num_cached_pages == 0
    llm.core.cache.check_invariants()


@pytest.fixture(scope="module")
def baseline() -> list[list[int]]:
    return _outputs(LLM(tiny_config("llama"), warmup=False, **SMALL))


def test_warm_up_leaves_no_trace_and_the_same_outputs(baseline) -> None:
    llm = LLM(tiny_config("llama"), warmup=True, **SMALL)
    report = llm.warmup_report
    assert isinstance(report, WarmupReport) and report.steps > 20 and report.seconds > 0
    _assert_untouched(llm)
    assert _outputs(llm) == baseline
    first = llm.generate([PROMPTS[0]], PARAMS[0])[0]
    assert first.request_id == str(len(PROMPTS))  # the warm-up consumed no request id


def test_the_report_names_the_shapes_it_covered() -> None:
    llm = LLM(tiny_config("llama"), warmup=True, **SMALL)
    shapes = llm.warmup_report.shapes
    assert shapes[0] == "fresh q=37"
    assert any(s.startswith("long prompt") for s in shapes)
    assert any(s.startswith("extend c=") and " q=1 " in s for s in shapes)  # a re-sent prompt: one new token
    assert any(s.endswith(" W=1") for s in shapes) and any(s.endswith(" W=16") for s in shapes)
    assert any(s.startswith("decode rows=") for s in shapes)
    assert any(s.startswith("mixed rows=") for s in shapes)
    assert {"top-k/top-p/min-p rows=1", "logprobs rows=1", "penalties rows=1"} <= set(shapes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        llm.warmup_report.steps = 0  # type: ignore[misc]


def test_a_second_warm_up_is_as_harmless(baseline) -> None:
    llm = LLM(tiny_config("llama"), warmup=False, **SMALL)
    assert llm.warmup_report is None  # on CPU warmup=None (the default) means off; here it is off outright
    llm.generate(PROMPTS[:1], PARAMS[0])  # an engine that has served, then warms: nothing of it remains
    llm.core.num_steps = llm.core.mixed_steps = 0
    warm_up(llm.core)
    _assert_untouched(llm)


def test_warm_up_is_off_on_cpu_by_default() -> None:
    llm = LLM(tiny_config("llama"), **SMALL)
    assert llm.config.warmup is None and llm.warmup_report is None


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_warmup_flag_must_be_a_bool_or_none(bad: object) -> None:
    with pytest.raises(ValueError, match="warmup must be True, False or None"):
        EngineConfig(warmup=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("more", [{"page_size": 4, "async_scheduling": True},
                                  {"max_num_batched_tokens": 32, "async_scheduling": True},
                                  {"enable_prefix_caching": False},
                                  {"num_pages": 24}],
                         ids=["page4-async", "small-budget", "no-prefix-cache", "small-pool"])
def test_warm_up_under_other_configs_leaves_no_trace(more: dict) -> None:
    kw = {**SMALL, **more}
    llm = LLM(tiny_config("llama"), warmup=True, **kw)
    _assert_untouched(llm)
    cold = LLM(tiny_config("llama"), warmup=False, **kw)
    assert _outputs(llm) == _outputs(cold)


def test_warm_up_with_int4_pages_runs_the_window_path() -> None:
    kw = {"max_num_seqs": 4, "num_pages": 128, "max_model_len": 256, "kv_dtype": "int4"}
    llm = LLM(tiny_config("llama"), warmup=True, **kw)
    assert llm.runner.kv_window  # INT pages read their latest tokens from the window
    _assert_untouched(llm)
    assert _outputs(llm) == _outputs(LLM(tiny_config("llama"), warmup=False, **kw))


def test_start_up_lines_are_logged_at_info(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="radixkv.engine.warmup"):
        llm = LLM(tiny_config("llama"), warmup=True, page_size=16, max_model_len=200, **SMALL)
    text = caplog.text
    assert "KV cache: fp32, 256 pages x 16 tokens = 4,096 tokens" in text
    assert "max concurrent requests at max_model_len 200: 19 (13 pages each); max_num_seqs 8" in text
    assert "CUDA graphs: none (eager steps)" in text
    assert f"warm-up: {llm.warmup_report.seconds:.2f} s, {llm.warmup_report.steps} steps" in text
    assert startup_lines(llm.core, None)[-1] == "warm-up: off"


def test_triton_cache_goes_to_radixkvs_cache_folder(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    assert use_radixkv_triton_cache() == os.path.join(str(tmp_path), "triton")
    assert os.environ["TRITON_CACHE_DIR"] == os.path.join(str(tmp_path), "triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # the user's choice wins
    assert use_radixkv_triton_cache() == "/elsewhere"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.delenv("RADIXKV_CACHE_DIR")
    assert use_radixkv_triton_cache() == os.path.join(os.path.expanduser("~"), ".cache", "radixkv", "triton")
