"""LLM.generate beyond plain parity: chunked prefill, preemption, stop tokens, seeded sampling,
random weights from a config, text prompts, few-shot sharing."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv import LLM, SamplingParams, SchedulerConfig

from .tiny_models import hf_greedy, hf_model, tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _prompts(n: int, lens: tuple[int, ...], seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 160, (lens[i % len(lens)],), generator=g).tolist() for i in range(n)]


def test_config_model_has_transformers_seeded_weights_and_matches_generate() -> None:
    cfg = tiny_config("qwen3")
    prompts = _prompts(2, (9, 30))
    ref = hf_model(cfg, seed=3)
    llm = LLM(cfg, page_size=4, num_pages=64, seed=3)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == [hf_greedy(ref, p, 12) for p in prompts]


def test_chunked_prefill_mixed_batches_and_preemption_keep_greedy_output() -> None:
    cfg = tiny_config("llama")
    ref = hf_model(cfg)
    prompts = _prompts(6, (23, 41, 7, 30))
    want = [hf_greedy(ref, p, 12) for p in prompts]
    # 16 tokens a step: prompts are chunked and share steps with other rows' decodes;
    # 14 pages of 4 tokens cannot hold every request at once, so some are preempted
    sched = SchedulerConfig(max_batch_tokens=16, max_running=4)
    llm = LLM(cfg, page_size=4, num_pages=14, scheduler=sched)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == want
    assert llm.core.scheduler.metrics.preemptions > 0
    assert llm.core.num_steps > 12
    llm.core.cache.evict(llm.num_pages)
    assert llm.core.pool.num_free == llm.num_pages


def test_stop_tokens_and_eos() -> None:
    cfg = tiny_config("mistral")
    prompt = _prompts(1, (15,))[0]
    full = LLM(cfg, page_size=16, num_pages=16).generate([prompt], GREEDY)[0].token_ids
    stop = full[3]
    first = full.index(stop)
    out = LLM(cfg, page_size=16, num_pages=16).generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]))[0]
    assert out.token_ids == full[:first + 1] and out.finish_reason == "stop"
    eos_cfg = tiny_config("mistral", eos_token_id=stop)
    llm = LLM(eos_cfg, page_size=16, num_pages=16)
    assert llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))[0].token_ids == full[:first + 1]
    assert llm.generate([prompt], GREEDY)[0].token_ids == full  # ignore_eos


def test_seeded_sampling_is_per_request_and_batch_independent() -> None:
    llm = LLM(tiny_config("qwen2"), page_size=16, num_pages=64)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, ignore_eos=True, seed=11)
    prompts = _prompts(3, (10, 20, 30))
    alone = llm.generate([prompts[0]], p)[0].token_ids
    batched = llm.generate(prompts, p)
    assert batched[0].token_ids == alone
    other = llm.generate([prompts[0]], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=12))
    assert other[0].token_ids != alone
    top1 = llm.generate([prompts[1]], SamplingParams(temperature=0.7, top_k=1, max_tokens=16, ignore_eos=True))
    assert top1[0].token_ids == llm.generate([prompts[1]], GREEDY.__class__(temperature=0.0, max_tokens=16,
                                                                             ignore_eos=True))[0].token_ids


def test_text_prompts_and_few_shot_prompts_share_their_examples(model_folder) -> None:
    from radixkv.workloads.few_shot import FewShotConfig, few_shot

    folder = model_folder("llama", tokenizer="plain", vocab_size=256)
    ref = AutoModelForCausalLM.from_pretrained(folder).eval()
    llm = LLM(folder, page_size=16, num_pages=512)
    out = llm.generate("Q: 1+1? A:", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    ids = llm.tokenizer("Q: 1+1? A:").input_ids
    assert out.prompt_token_ids == ids and out.token_ids == hf_greedy(ref, ids, 6)
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)

    reqs = few_shot(FewShotConfig(templates=2, shots=2, prompts_per_template=3, example_len=40, question_len=8))
    head = 2 * 40
    small = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    seen: set[str] = set()
    for r in reqs:  # one at a time: from the second prompt of a template on, the examples hit
        o = llm.generate([(r.tokens() % 256).tolist()], small)[0]
        if r.session in seen:
            assert o.cached_tokens >= head // 16 * 16
        seen.add(r.session)
    assert len(seen) == 2


def test_eos_stops_like_transformers_generate() -> None:
    cfg = tiny_config("llama")
    ref = hf_model(cfg)
    prompts = _prompts(6, (23, 41, 7, 30))  # prompt 1 meets EOS (id 2) after 9 tokens
    want = [hf_greedy(ref, p, 12, stop_at_eos=True) for p in prompts]
    outs = LLM(cfg, page_size=4, num_pages=128).generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    assert [o.token_ids for o in outs] == want
    assert outs[1].finish_reason == "stop" and outs[1].token_ids[-1] == 2 and len(outs[1].token_ids) < 12
    assert outs[0].finish_reason == "length"


def test_served_requests_are_recorded_as_a_replayable_trace(tmp_path) -> None:
    from radixkv.workloads.traces import read_radixkv

    llm = LLM(tiny_config("llama"), page_size=4, num_pages=64)
    llm.generate([[9, 9, 9]], GREEDY)  # before recording: not kept
    llm.start_recording()
    prompts = _prompts(3, (5, 8, 13))
    llm.generate(prompts, GREEDY)
    assert llm.save_recording(tmp_path / "served.jsonl") == 3
    trace = read_radixkv(tmp_path / "served.jsonl")
    assert [r.tokens().tolist() for r in trace.requests] == prompts
    assert [r.max_tokens for r in trace.requests] == [12] * 3


def test_mistral_sliding_window_bounds_the_sequence() -> None:
    llm = LLM(tiny_config("mistral", sliding_window=32), page_size=4, num_pages=64)
    with pytest.raises(ValueError, match="sliding window of 32"):
        llm.generate([list(range(3, 30))], GREEDY)  # 27 + 12 > 32
    assert len(llm.generate([list(range(3, 20))], GREEDY)[0].token_ids) == 12


def test_use_tqdm_shows_progress_and_changes_nothing(capsys) -> None:
    llm = LLM(tiny_config("llama"), page_size=4, num_pages=64)
    prompts = _prompts(2, (9, 5))
    plain = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert "2/2" not in capsys.readouterr().err
    assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=True)] == plain
    assert "2/2" in capsys.readouterr().err
