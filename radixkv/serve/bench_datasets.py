"""The request sets of `radixkv bench-serve` (bench_client.py sends them): `random` and
`prefix-repetition` (token-id prompts, a list of ints being a valid OpenAI prompt), `sharegpt` (text
prompts from a ShareGPT JSON file) and `trace` (radixkv/Mooncake/WEKA files or a bundled trace name, read
with `load_trace`, token ids folded into `[token_id_low, vocab_size)` so equal prefixes stay equal).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from radixkv.files import GiB, UnreadableFile, check_regular, read_text_bounded

from .bench_results import BenchError, BenchRequest

DATASETS = ("random", "prefix-repetition", "sharegpt", "trace")
MAX_SHAREGPT_BYTES = 1 * GiB  # ShareGPT_V3_unfiltered_cleaned_split.json is 0.6 GiB; parsing costs ~10x


def _rand_ids(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    return [rng.randrange(low, high) for _ in range(n)]


def _check_vocab(low: int, vocab_size: int) -> None:
    if not 0 <= low < vocab_size:
        raise BenchError(f"--token-id-low {low} must lie in [0, --vocab-size {vocab_size})")


def random_dataset(num_prompts: int, input_len: int, output_len: int, *, range_ratio: float = 0.0,
                   prefix_len: int = 0, vocab_size: int = 256, low: int = 0, seed: int = 0) -> list[BenchRequest]:
    """vLLM's `random`: input/output lengths uniform in [len * (1 - r), len * (1 + r)], plus an
    optional shared prefix of `prefix_len` random ids."""
    _check_vocab(low, vocab_size)
    if not 0.0 <= range_ratio < 1.0:
        raise BenchError(f"--random-range-ratio must lie in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    prefix = _rand_ids(rng, prefix_len, low, vocab_size)
    out = []
    for _ in range(num_prompts):
        n_in = max(1, rng.randint(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))))
        n_out = max(1, rng.randint(int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))))
        out.append(BenchRequest(prefix + _rand_ids(rng, n_in, low, vocab_size), n_out))
    return out


def prefix_repetition_dataset(num_prompts: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                              output_len: int, *, vocab_size: int = 256, low: int = 0,
                              seed: int = 0) -> list[BenchRequest]:
    """vLLM's `prefix-repetition`: `num_prefixes` random prefixes, each prompt one of them plus a
    random suffix, shuffled (so a prefix-caching server hits on all but the first of each)."""
    _check_vocab(low, vocab_size)
    if num_prefixes < 1:
        raise BenchError("--prefix-repetition-num-prefixes must be >= 1")
    rng = random.Random(seed)
    prefixes = [_rand_ids(rng, prefix_len, low, vocab_size) for _ in range(num_prefixes)]
    out = [BenchRequest(prefixes[i % num_prefixes] + _rand_ids(rng, suffix_len, low, vocab_size), output_len)
           for i in range(num_prompts)]
    rng.shuffle(out)
    return out


def sharegpt_dataset(path: str | None, num_prompts: int, *, output_len: int | None = None,
                     seed: int = 0) -> list[BenchRequest]:
    """ShareGPT JSON (a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}):
    the first human turn as the prompt text; output length `output_len`, else the reply's
    characters / 4 (no tokenizer on the client), at least 1."""
    if not path:
        raise BenchError("--dataset-name sharegpt needs --dataset-path FILE.json")
    try:
        data = json.loads(read_text_bounded(path, MAX_SHAREGPT_BYTES, "ShareGPT JSON file"))
    except UnreadableFile as err:  # a FIFO, /dev/zero, a file past the bound
        raise BenchError(f"--dataset-path {err}") from None
    except OSError as err:
        raise BenchError(f"cannot read --dataset-path {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise BenchError(f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})") from None
    except RecursionError:
        raise BenchError(f"{path}: not JSON (nested too deeply)") from None
    except ValueError as err:  # json.JSONDecodeError, and a number of too many digits
        raise BenchError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise BenchError(f"{path}: expected a JSON list of conversations")
    pairs = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        text, reply = first.get("value"), second.get("value")
        if isinstance(text, str) and text and isinstance(reply, str):
            pairs.append((text, output_len or max(1, len(reply) // 4)))
    if not pairs:
        raise BenchError(f"{path}: no conversation with a prompt and a reply")
    random.Random(seed).shuffle(pairs)
    return [BenchRequest(text, n) for text, n in pairs[:num_prompts]]


def trace_dataset(path: str | None, num_prompts: int | None, *, vocab_size: int = 256, low: int = 0,
                  max_input_len: int | None = None, output_len: int | None = None,
                  time_scale: float = 1.0) -> list[BenchRequest]:
    """A trace file (or a bundled trace name): token ids folded into [low, vocab_size) (equal ids
    stay equal, so shared prefixes stay shared), optionally cut to `max_input_len`; arrival times
    times `time_scale`, relative to the first request."""
    from radixkv.workloads.data import BUNDLED, DEFAULT_TRACE, bundled_trace
    from radixkv.workloads.trace_loading import load_trace
    from radixkv.workloads.traces import TraceError

    _check_vocab(low, vocab_size)
    name = path or DEFAULT_TRACE
    file = Path(name)
    if not file.exists() and name in BUNDLED:
        file = bundled_trace(name)
    try:
        if file.exists():  # a FIFO would block the reader for good (a missing file: the reader says so)
            check_regular(file, "trace file", folder_ok=True)
        trace = load_trace(file)
    except UnreadableFile as err:
        raise BenchError(f"--dataset-path {err}") from None
    except (TraceError, FileNotFoundError) as err:
        raise BenchError(str(err)) from None
    reqs = trace.requests[:num_prompts] if num_prompts else trace.requests
    if not reqs:
        raise BenchError(f"{name}: no requests")
    t0 = min(r.arrival_s for r in reqs)
    out = []
    for r in reqs:
        ids = r.tokens()
        if max_input_len:
            ids = ids[:max_input_len]
        folded = [int(t) % (vocab_size - low) + low for t in ids]
        out.append(BenchRequest(folded, output_len or max(1, int(r.max_tokens)),
                                (r.arrival_s - t0) * time_scale))
    return out
