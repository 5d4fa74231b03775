"""argparse value types shared by the `radixkv` subcommands (no torch): each raises
ArgumentTypeError with the message argparse prints after the flag's name."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


MAX_REQUEST_TOKENS = 1 << 24  # tokens a request: what the trace readers accept (workloads/trace_records.py)
MAX_COUNT = 1 << 20  # requests, sessions, groups, prompts...: far past any benchmark, far below a runaway


def int_at_least(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """An int >= minimum (1: 'a positive integer', 0: 'a non-negative integer'), and with `maximum`
    at most that (`why` says where the bound comes from, e.g. '2**24 tokens a request')."""
    what = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")
    if maximum is not None:
        what += f" of at most {maximum:,}" + (f" ({why})" if why else "")

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        if maximum is not None and v > maximum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v:,}" if v < 10**30
                                             else f"expected {what}, got a {len(str(v))}-digit integer")
        return v
    return parse


def finite_float_at_least(minimum: float, *, exclusive: bool = False) -> Callable[[str], float]:
    """A finite float >= minimum (> minimum with exclusive): nan and inf are refused."""
    what = f"a finite number {'>' if exclusive else '>='} {minimum:g}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(v) or v < minimum or (exclusive and v == minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
# sizes that become memory: tokens of one request, and how many of something
token_count = int_at_least(1, MAX_REQUEST_TOKENS, "2**24 tokens a request")
token_count_or_0 = int_at_least(0, MAX_REQUEST_TOKENS, "2**24 tokens a request")
count = int_at_least(1, MAX_COUNT, "2**20")
