"""Synthetic workload generators: the sharing structure each one promises."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixkv.workloads import poisson_arrivals
from radixkv.workloads.few_shot import INSTRUCTION, FewShotConfig, few_shot
from radixkv.workloads.multi_turn import MultiTurnConfig, multi_turn, session_turns, sharegpt_turn_lengths
from radixkv.workloads.shared_prefix import SharedPrefixConfig, shared_prefix
from radixkv.workloads.trace_loading import load_trace
from radixkv.workloads.traces import write_trace

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
SHAREGPT = SHARED / "sharegpt" / "sharegpt_v3_multiturn_first2000.jsonl"
GSM8K = SHARED / "gsm8k"


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def test_shared_prefix_groups():
    cfg = SharedPrefixConfig(groups=3, prompts_per_group=4, system_len=50, question_len=10, max_tokens=7, seed=5)
    reqs = shared_prefix(cfg)
    assert len(reqs) == 12 and all(r.num_prompt_tokens == 60 and r.max_tokens == 7 for r in reqs)
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    by_group = {}
    for r in reqs:
        by_group.setdefault(r.session, []).append(r.tokens())
    assert sorted(by_group) == ["group-0", "group-1", "group-2"]
    for toks in by_group.values():
        assert all(_common_prefix(toks[0], t) >= 50 for t in toks[1:])
        assert all(_common_prefix(toks[0], t) < 60 for t in toks[1:])
    heads = [v[0][:50] for v in by_group.values()]
    assert not np.array_equal(heads[0], heads[1])
    again = shared_prefix(cfg)  # seeded: identical
    assert all(np.array_equal(a.tokens(), b.tokens()) for a, b in zip(reqs, again))


def test_multi_turn_prompts_extend_history():
    reqs = multi_turn(MultiTurnConfig(sessions=4, max_turns=3, system_len=30, user_len=10, reply_len=20, seed=7))
    turns = session_turns(reqs)
    assert len(turns) == 4 and all(len(t) == 3 for t in turns.values())
    for chat in turns.values():
        for prev, nxt in zip(chat, chat[1:]):
            assert nxt.arrival_s >= prev.arrival_s
            p, n = prev.tokens(), nxt.tokens()
            # the next turn resends the previous prompt plus its reply (max_tokens long)
            assert len(n) > len(p) + prev.max_tokens and np.array_equal(n[: len(p)], p)
    firsts = [chat[0].tokens()[:30] for chat in turns.values()]
    assert all(np.array_equal(firsts[0], f) for f in firsts)  # shared system prompt


@pytest.mark.skipif(not SHAREGPT.exists(), reason="shared ShareGPT data not present")
def test_multi_turn_sharegpt_lengths():
    shapes = sharegpt_turn_lengths(SHAREGPT, sessions=3, max_turns=2)
    reqs = multi_turn(MultiTurnConfig(sessions=3, max_turns=2, system_len=0, max_reply=10**6), SHAREGPT)
    chat0 = session_turns(reqs)["chat-0"]
    (u0, a0), (u1, _) = shapes[0]
    assert chat0[0].num_prompt_tokens == u0 and chat0[0].max_tokens == a0
    assert chat0[1].num_prompt_tokens == u0 + a0 + u1


def test_few_shot_synthetic_shares_examples():
    cfg = FewShotConfig(templates=2, shots=4, prompts_per_template=5, example_len=20, question_len=8, seed=1)
    reqs = few_shot(cfg)
    assert len(reqs) == 10
    by_t = {}
    for r in reqs:
        by_t.setdefault(r.session, []).append(r.tokens())
    for toks in by_t.values():
        assert len(toks) == 5 and all(_common_prefix(toks[0], t) >= 80 for t in toks[1:])


@pytest.mark.skipif(not GSM8K.exists(), reason="shared GSM8K data not present")
def test_few_shot_gsm8k_text():
    reqs = few_shot(FewShotConfig(templates=1, shots=2, prompts_per_template=3), GSM8K)
    texts = [bytes(r.tokens().astype(np.uint8)).decode() for r in reqs]
    assert all(t.startswith(INSTRUCTION) and t.count("Question:") == 3 and t.endswith("Answer:") for t in texts)
    head = texts[0][: texts[0].rindex("Question:")]
    assert all(t.startswith(head) for t in texts)


def test_generated_trace_roundtrips(tmp_path):
    reqs = multi_turn(MultiTurnConfig(sessions=2, max_turns=2, seed=3))
    p = tmp_path / "mt.jsonl"
    write_trace(p, reqs)
    back = load_trace(p).requests
    assert [(r.arrival_s, r.session, r.max_tokens) for r in back] == \
           [(round(r.arrival_s, 6), r.session, r.max_tokens) for r in reqs]
    assert all(np.array_equal(a.tokens(), b.tokens()) for a, b in zip(reqs, back))


def test_poisson_arrivals_and_config_checks():
    t = poisson_arrivals(np.random.default_rng(0), 2000, rate=4.0)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert np.mean(np.diff(t)) == pytest.approx(0.25, rel=0.1)
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(np.random.default_rng(0), 3, rate=0)
    with pytest.raises(ValueError, match="groups"):
        SharedPrefixConfig(groups=0)
    with pytest.raises(ValueError, match="shots"):
        FewShotConfig(shots=0)
    with pytest.raises(ValueError, match="sessions"):
        MultiTurnConfig(sessions=0)


BAD_OPTIONS = [  # (field, bad value, words the error must hold): counts, lengths, rate, seed
    ("rate", float("nan"), "rate must be > 0"),
    ("rate", -1.0, "rate must be > 0"),
    ("rate", 0, "rate must be > 0"),
    ("rate", "4", "rate must be a number"),
    ("rate", True, "rate must be a number"),
    ("seed", -1, "seed must be >= 0"),
    ("seed", 1.5, "seed must be an integer"),
    ("max_tokens", 0, "max_tokens must be >= 1"),
    ("max_tokens", 2.0, "max_tokens must be an integer"),
    ("max_tokens", 2**31, "max_tokens must be <= 2147483647"),
]
CONFIGS = [  # each generator's config, and the names its count and length fields go by
    pytest.param(MultiTurnConfig, {"max_tokens": "max_reply", "count": "sessions", "length": "user_len"},
                 id="multi-turn"),
    pytest.param(FewShotConfig, {"count": "shots", "length": "example_len"}, id="few-shot"),
    pytest.param(SharedPrefixConfig, {"count": "groups", "length": "system_len"}, id="shared-prefix"),
]


@pytest.mark.parametrize("config, names", CONFIGS)
@pytest.mark.parametrize("field, bad, words", BAD_OPTIONS)
def test_generator_configs_refuse_bad_options_naming_the_field(config, names, field, bad, words):
    name = names.get(field, field)
    with pytest.raises(ValueError, match=words.replace(field, name, 1)):
        config(**{name: bad})


@pytest.mark.parametrize("config, names", CONFIGS)
def test_generator_configs_refuse_bad_counts_and_lengths(config, names):
    for key in ("count", "length"):
        for bad, words in ((-3, ">= "), (2.5, "integer"), (False, "integer"), (None, "integer")):
            with pytest.raises(ValueError, match=f"{names[key]} must be .*{words}"):
                config(**{names[key]: bad})


@pytest.mark.parametrize("config", [MultiTurnConfig, FewShotConfig, SharedPrefixConfig])
def test_generator_rate_inf_puts_every_arrival_at_zero_and_big_seeds_work(config):
    gen = {MultiTurnConfig: multi_turn, FewShotConfig: few_shot, SharedPrefixConfig: shared_prefix}[config]
    small = {MultiTurnConfig: dict(sessions=2, max_turns=1, think_s=0.0),
             FewShotConfig: dict(prompts_per_template=2), SharedPrefixConfig: dict(prompts_per_group=2)}[config]
    reqs = gen(config(rate=float("inf"), seed=2**70, **small))
    assert reqs and all(r.arrival_s == 0.0 for r in reqs)


def test_multi_turn_refuses_a_think_time_that_is_not_finite():
    for bad in (float("nan"), float("inf"), -1.0, "1"):
        with pytest.raises(ValueError, match="think_s"):
            MultiTurnConfig(think_s=bad)
    with pytest.raises(ValueError, match="system_len must be >= 0"):
        MultiTurnConfig(system_len=-1)
    with pytest.raises(ValueError, match="shuffle"):
        SharedPrefixConfig(shuffle="yes")
