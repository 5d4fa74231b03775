"""`radixkv gen multi-turn|few-shot|shared-prefix -o OUT.jsonl`: a synthetic trace (radixkv JSONL)."""
from __future__ import annotations

import argparse
from typing import Any

from radixkv.argtypes import MAX_REQUEST_TOKENS, count, token_count
from radixkv.cli.common import CliError, not_utf8, one_line
from radixkv.files import UnreadableFile, check_regular
from radixkv.workloads import WorkloadKind
from radixkv.workloads.traces import TraceRequest


def add_gen_parser(sub: Any) -> None:
    """Add `gen` to the subparsers; sets `run`."""
    g = sub.add_parser("gen", help="generate a synthetic trace (radixkv JSONL)")
    g.add_argument("kind", type=WorkloadKind, choices=list(WorkloadKind),
                   metavar="{" + ",".join(k.value for k in WorkloadKind) + "}")
    g.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--source", metavar="PATH",
                   help="real text to draw from (ShareGPT JSONL for multi-turn, GSM8K folder/JSONL for few-shot)")
    g.add_argument("--sessions", type=count, default=16, help="multi-turn: chat sessions")
    g.add_argument("--turns", type=count, default=4, help="multi-turn: turns per session (at most)")
    g.add_argument("--shots", type=count, default=5, help="few-shot: examples per prompt")
    g.add_argument("--templates", type=count, default=2, help="few-shot: distinct example sets")
    g.add_argument("--groups", type=count, default=8, help="shared-prefix: groups of prompts")
    g.add_argument("--prompts", type=count, default=16,
                   help="shared-prefix: prompts per group; few-shot: prompts per template")
    g.add_argument("--system-len", type=token_count, default=1024, help="shared-prefix: system prompt tokens")
    g.add_argument("--question-len", type=token_count, default=128, help="shared-prefix: question tokens")
    g.add_argument("--max-tokens", type=token_count, default=64, help="output tokens per request")
    g.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second (Poisson)")
    g.set_defaults(run=_cmd_gen)


def _cmd_gen(a: argparse.Namespace) -> int:
    _check_sizes(a)
    try:
        if a.source:  # a FIFO or a device would block or never end: refused before the readers open it
            check_regular(a.source, "file", folder_ok=True)
        reqs = _generate(a)
    except UnreadableFile as e:
        raise CliError(f"--source {e}") from None
    except UnicodeDecodeError as e:  # --source: the readers open it as UTF-8 text
        raise CliError(not_utf8("--source", a.source, e)) from None
    except OSError as e:  # missing, a folder where a file belongs
        raise CliError(f"--source {a.source}: {e.strerror or e}: {e.filename}") from None
    except ValueError as e:  # a bad generator setting (e.g. --rate 0 or nan), named by its config
        raise CliError(one_line(e)) from None
    from radixkv.workloads.traces import write_trace

    try:
        n = write_trace(a.output, reqs)
    except OSError as e:  # -o names a folder, an unwritable or missing place
        raise CliError(f"{a.output}: cannot write the trace: {e.strerror or e}") from None
    print(f"wrote {n} requests ({sum(r.num_prompt_tokens for r in reqs):,} prompt tokens) to {a.output}")
    return 0


MAX_TRACE_TOKENS = 1 << 28  # prompt tokens a generated trace may hold in all (~2 GiB as int64 while built)


def _sizes(a: argparse.Namespace) -> tuple[int, int, str]:
    """(the longest prompt, all prompt tokens, the flags that set them) a generator would make, from the
    generators' default lengths (multi-turn: each turn's prompt holds the chat so far)."""
    if a.kind is WorkloadKind.SHARED_PREFIX:
        each = a.system_len + a.question_len
        return each, a.groups * a.prompts * each, "--groups x --prompts x (--system-len + --question-len)"
    if a.kind is WorkloadKind.FEW_SHOT:
        from radixkv.workloads.few_shot import FewShotConfig

        d = FewShotConfig()
        each = a.shots * d.example_len + d.question_len
        return each, a.templates * a.prompts * each, "--templates x --prompts x --shots"
    from radixkv.workloads.multi_turn import MultiTurnConfig

    d = MultiTurnConfig()
    turn = d.user_len + min(d.reply_len, a.max_tokens)
    last = d.system_len + a.turns * turn
    return last, a.sessions * (a.turns * d.system_len + turn * a.turns * (a.turns + 1) // 2), "--sessions x --turns"


def _check_sizes(a: argparse.Namespace) -> None:
    """Refuse, before anything is built, a trace whose prompts or whole exceed what is sane to build and
    what the trace readers take (2**24 tokens a request)."""
    each, total, flags = _sizes(a)
    if each > MAX_REQUEST_TOKENS:
        raise CliError(f"{a.kind.value}: prompts of about {each:,} tokens, more than {MAX_REQUEST_TOKENS:,} "
                       f"(2**24 tokens a request); lower {flags.split(' x ')[-1]}")
    if total > MAX_TRACE_TOKENS:
        raise CliError(f"{a.kind.value}: about {total:,} prompt tokens in all ({flags}), more than a generated "
                       f"trace holds ({MAX_TRACE_TOKENS:,}, 2**28)")


def _generate(a: argparse.Namespace) -> list[TraceRequest]:
    if a.kind is WorkloadKind.MULTI_TURN:
        from radixkv.workloads.multi_turn import MultiTurnConfig, multi_turn

        reqs = multi_turn(MultiTurnConfig(sessions=a.sessions, max_turns=a.turns, rate=a.rate, seed=a.seed,
                                          max_reply=a.max_tokens), a.source)
    elif a.kind is WorkloadKind.FEW_SHOT:
        from radixkv.workloads.few_shot import FewShotConfig, few_shot

        reqs = few_shot(FewShotConfig(templates=a.templates, shots=a.shots, prompts_per_template=a.prompts,
                                      max_tokens=a.max_tokens, rate=a.rate, seed=a.seed), a.source)
    else:
        from radixkv.workloads.shared_prefix import SharedPrefixConfig, shared_prefix

        reqs = shared_prefix(SharedPrefixConfig(groups=a.groups, prompts_per_group=a.prompts,
                                                system_len=a.system_len, question_len=a.question_len,
                                                max_tokens=a.max_tokens, rate=a.rate, seed=a.seed))
    return reqs
