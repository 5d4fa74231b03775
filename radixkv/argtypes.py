"""argparse value types shared by the `radixkv` subcommands (no torch): each raises
ArgumentTypeError with the message argparse prints after the flag's name."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An int >= minimum (1: 'a positive integer', 0: 'a non-negative integer')."""
    what = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
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
