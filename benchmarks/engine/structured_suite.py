"""Structured outputs hold on the 8B shape (issue 36 target: 100% of outputs parse and validate against their
JSON schema over >= 30 schemas; choice answers are always one of the choices; regex outputs match).

A Llama-3-8B shape with random weights and SmolLM2's tokenizer (`LLM(folder, load_format="dummy")` over a
folder of config.json + SmolLM2's tokenizer files; structured_step.py's `folder()`). Every schema of
radixkv.workloads.json_schemas (json), five choice sets, six regexes and three EBNF grammars, each once
greedy and `--seeds` times sampled (temperature 1.0, seeds 0..N-1), all in one `LLM.generate`, max_tokens
256. Random weights wander: an output cut by max_tokens (finish_reason "length") is not complete and is
never counted as valid; the claim is about outputs that finished by "stop": each one must parse (strict
json.loads: a raw control character inside a string is not JSON, RFC 8259) and validate (jsonschema), be one
of its choices, or fullmatch its regex / the grammar's language. Known hole: xgrammar 0.2.9 lowers a string
with maxLength to N of any character but quote, backslash, CR and LF, so U+0000-U+001F get in unescaped
(mlc-ai/xgrammar#800, open).
Prints a table last (kind, requests, finished stop, finished length, valid of stopped); rows to --json;
exits 1 if any stopped output is invalid.

GPU machine (.whl holds xgrammar and jsonschema with referencing, jsonschema-specifications and rpds-py,
cp312 wheels: the device image has no jsonschema; .devshare holds smollm2-tokenizer, written by
`bash benchmarks/serve/run_h200.sh --prepare`), about 3 minutes:

    run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
                 --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && (python3 -c 'import
                 radixkv.kernels' 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation
                 --no-index -e .) && python3 benchmarks/engine/structured_suite.py --json
                 $OUT/structured_suite.json", carry=[".whl", ".devshare"], timeout_s=600)

    (one line; then copy $OUT/structured_suite.json to benchmarks/results/)

CPU, a tiny model (checks the script, well under a minute):

    python benchmarks/engine/structured_suite.py --smoke
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from structured_step import folder  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.workloads.json_schemas import SCHEMAS, schema_prompt  # noqa: E402

CHOICES = [
    ["Paris", "London", "a city in Spain"],
    ["yes", "no"],
    ["red", "green", "blue", "yellow"],
    ["A", "B", "C", "D"],
    ["positive", "negative", "neutral"],
]
REGEXES = [
    r"\(\d{3}\) \d{3}-\d{4}",
    r"\d{4}-\d{2}-\d{2}",
    r"[A-Z][a-z]{2,8}",
    r"(\d{1,3}\.){3}\d{1,3}",
    r"0x[0-9a-f]{4,8}",
    r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
]


def _balanced(text: str) -> bool:
    """In the language of `root ::= "(" root ")" | "x"`: n opening parentheses, x, n closing."""
    n = len(text) - len(text.lstrip("("))
    return text == "(" * n + "x" + ")" * n


# (EBNF grammar, a check of its language written independently of xgrammar)
GRAMMARS: list[tuple[str, Callable[[str], bool]]] = [
    ('root ::= "yes" | "no" | ("maybe " [0-9])', lambda t: re.fullmatch(r"yes|no|maybe [0-9]", t) is not None),
    ('root ::= pair ("; " pair)? ("; " pair)?\npair ::= key "=" val\nkey ::= "a" | "b" | "c"\n'
     'val ::= [0-9] | "true" | "false"',
     lambda t: re.fullmatch(r"[abc]=([0-9]|true|false)(; [abc]=([0-9]|true|false)){0,2}", t) is not None),
    ('root ::= "(" root ")" | "x"', _balanced),
]


@dataclass(frozen=True)
class Case:
    kind: str  # json, choice, regex, grammar
    prompt: str
    spec: dict[str, Any]  # the structured_outputs field
    check: Callable[[str], bool]  # is a stopped output's text valid


def _json_check(schema: dict[str, Any]) -> Callable[[str], bool]:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)

    def check(text: str) -> bool:
        try:
            return validator.is_valid(json.loads(text))
        except json.JSONDecodeError:
            return False
    return check


def cases(schemas: list[dict[str, Any]], choices: list[list[str]], regexes: list[str],
          grammars: list[tuple[str, Callable[[str], bool]]]) -> list[Case]:
    out = [Case("json", schema_prompt(s), {"json": s}, _json_check(s)) for s in schemas]
    out += [Case("choice", f"Answer with one of {', '.join(c)}:", {"choice": c}, lambda t, c=c: t in c)
            for c in choices]
    out += [Case("regex", f"Write a string matching /{r}/:", {"regex": r},
                 lambda t, r=r: re.fullmatch(r, t) is not None) for r in regexes]
    out += [Case("grammar", f"Write a sentence of this grammar:\n{g}\n", {"grammar": g}, check)
            for g, check in grammars]
    return out


def params(case: Case, seed: int | None, max_tokens: int) -> SamplingParams:
    """Greedy when seed is None, else sampled at temperature 1.0 with that seed."""
    return SamplingParams(temperature=0.0 if seed is None else 1.0, seed=seed, max_tokens=max_tokens,
                          structured_outputs=case.spec)


def tally(runs: list[tuple[Case, int | None]], outs: list[Any]) -> list[dict[str, Any]]:
    """One row a kind and one for all: requests, finished by stop / length / other, valid of the stopped, the
    invalid outputs in full and two cut by length (their first 200 characters)."""
    rows: dict[str, dict[str, Any]] = {}
    for (case, seed), o in zip(runs, outs):
        done = o.outputs[0]
        r = rows.setdefault(case.kind, {"kind": case.kind, "cases": 0, "requests": 0, "stop": 0, "length": 0,
                                        "other": 0, "valid_of_stop": 0, "output_tokens": 0, "invalid": [],
                                        "length_examples": []})
        r["cases"] += seed is None
        r["requests"] += 1
        r["output_tokens"] += len(done.token_ids)
        reason = str(done.finish_reason)
        if reason == "stop":
            r["stop"] += 1
            if case.check(done.text):
                r["valid_of_stop"] += 1
            else:
                r["invalid"].append({"spec": case.spec, "seed": seed, "text": done.text})
        elif reason == "length":
            r["length"] += 1
            if len(r["length_examples"]) < 2:
                r["length_examples"].append({"spec": case.spec, "seed": seed, "text": done.text[:200]})
        else:
            r["other"] += 1
    total = {"kind": "all", **{k: sum(r[k] for r in rows.values())
                               for k in ("cases", "requests", "stop", "length", "other", "valid_of_stop",
                                         "output_tokens")}}
    return [*rows.values(), total]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=3, help="sampled runs of each case (temperature 1.0)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, a part of the suite")
    ap.add_argument("--json")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.smoke:
        suite = cases(SCHEMAS[:6], CHOICES[:2], REGEXES[:2], GRAMMARS)
        a.max_tokens, a.seeds = min(a.max_tokens, 32), min(a.seeds, 1)
    else:
        suite = cases(SCHEMAS, CHOICES, REGEXES, GRAMMARS)
    llm = LLM(folder(a.smoke), load_format="dummy", dtype="bfloat16" if device == "cuda" else "float32",
              device=device, **({"num_pages": 512} if a.smoke else {}))
    runs = [(c, seed) for c in suite for seed in [None, *range(a.seeds)]]
    t = time.perf_counter()
    outs = llm.generate([c.prompt for c, _ in runs], [params(c, seed, a.max_tokens) for c, seed in runs])
    secs = time.perf_counter() - t
    table = tally(runs, outs)
    total = table[-1]
    model = "smoke (tiny Llama, 49,152 vocab)" if a.smoke else "Llama-3-8B shape, random bf16, 49,152 vocab"
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "model": model,
            "max_tokens": a.max_tokens, "seeds": a.seeds, "generate_seconds": round(secs, 3)}
    for r in table:
        r.update(meta)
        r["valid_pct_of_stop"] = round(100.0 * r["valid_of_stop"] / r["stop"], 2) if r["stop"] else None
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1))
    for r in table[:-1]:  # what broke, above the table
        for bad in r["invalid"][:3]:
            print(f"INVALID {r['kind']} seed={bad['seed']} {json.dumps(bad['spec'])[:100]}: {bad['text']!r}")
    print(f"\n{meta['model']} on {meta['device']}, max_tokens {a.max_tokens}, greedy + {a.seeds} seeds, "
          f"{total['requests']} requests in {secs:.1f} s")
    print(f"{'kind':>8} {'requests':>9} {'stop':>6} {'length':>7} {'valid of stop':>14}")
    for r in table:
        pct = "-" if r["valid_pct_of_stop"] is None else f"{r['valid_pct_of_stop']:.1f}%"
        print(f"{r['kind']:>8} {r['requests']:>9} {r['stop']:>6} {r['length']:>7} "
              f"{r['valid_of_stop']:>6}/{r['stop']:<4} {pct:>6}")
    sys.exit(0 if total["valid_of_stop"] == total["stop"] else 1)


if __name__ == "__main__":
    main()
