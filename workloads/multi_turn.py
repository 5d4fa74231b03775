"""Multi-turn chat workload: each turn resends the whole conversation so far.

Turn k of a session sends system + user_1 + reply_1 + ... + user_k and asks for reply_k, so
turn k's prompt is a prefix of turn k+1's: the part a prefix cache should keep. Replies are
assumed to be exactly the recorded (or drawn) reply tokens, so the next turn hits them.

Turn lengths come from ShareGPT conversations when a file is given (tokens ~ UTF-8 bytes / 4,
the usual English ratio), otherwise from exponential distributions; token ids are synthetic.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import poisson_arrivals, random_tokens
from .traces import TraceError, TraceRequest

BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class MultiTurnConfig:
    sessions: int = 16
    max_turns: int = 4  # turns per session, at most (ShareGPT chats may have fewer)
    system_len: int = 256  # tokens of the system prompt shared by all sessions
    user_len: int = 64  # mean tokens of a user turn (without ShareGPT)
    reply_len: int = 128  # mean tokens of a reply (without ShareGPT)
    max_reply: int = 1024  # replies (max_tokens) are capped here
    rate: float = 1.0  # sessions started per second (Poisson; inf: all at 0)
    think_s: float = 10.0  # mean user think time between a turn and the next
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sessions", "max_turns", "user_len", "reply_len", "max_reply"):
            _check_int(name, getattr(self, name), 1)
        _check_int("system_len", self.system_len, 0)
        _check_rate(self.rate)
        if (isinstance(self.think_s, bool) or not isinstance(self.think_s, (int, float))
                or not math.isfinite(self.think_s) or self.think_s < 0):
            raise ValueError(f"think_s must be a finite number of seconds >= 0, got {self.think_s!r}")
        _check_int("seed", self.seed, 0, None)  # numpy takes any non-negative int


# ---- option checks shared by the generators' configs (a bad option raises ValueError naming
# it, so a trace with NaN arrivals or absurd lengths is never written) ----
_MAX_LEN = 2**31 - 1  # token counts and max_tokens are int32 downstream (page tables, traces)


def _check_int(name: str, value: object, minimum: int, maximum: int | None = _MAX_LEN) -> None:
    """`value` an integer (not a bool or float) in [minimum, maximum] (None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def _check_rate(rate: object) -> None:
    """Arrivals per second: a number > 0; inf puts every arrival at 0; NaN is refused."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        raise ValueError(f"rate must be a number of arrivals per second, got {rate!r}")
    if not rate > 0:  # also NaN
        raise ValueError(f"rate must be > 0 (inf: all at time 0), got {rate}")


def sharegpt_turn_lengths(path: str | Path, sessions: int, max_turns: int) -> list[list[tuple[int, int]]]:
    """(user_tokens, reply_tokens) per turn for the first `sessions` usable ShareGPT chats."""
    path = Path(path)
    out: list[list[tuple[int, int]]] = []
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if len(out) == sessions:
                break
            try:
                conv = json.loads(line)["conversations"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TraceError(path, lineno, "conversations", "not a ShareGPT record") from None
            turns = []
            for a, b in zip(conv[::2], conv[1::2]):
                if a.get("from") != "human" or b.get("from") != "gpt":
                    break
                turns.append(tuple(max(1, len(str(x.get("value", "")).encode()) // BYTES_PER_TOKEN) for x in (a, b)))
            if turns:
                out.append(turns[:max_turns])
    if not out:
        raise TraceError(path, 1, "conversations", "no human/gpt turn pairs found")
    return out


def multi_turn(cfg: MultiTurnConfig, sharegpt: str | Path | None = None) -> list[TraceRequest]:
    """Requests of all sessions in arrival order; `session` is "chat-<i>"."""
    rng = np.random.default_rng(cfg.seed)
    if sharegpt is not None:
        shapes = sharegpt_turn_lengths(sharegpt, cfg.sessions, cfg.max_turns)
    else:
        shapes = [[(1 + int(rng.exponential(cfg.user_len)), 1 + int(rng.exponential(cfg.reply_len)))
                   for _ in range(cfg.max_turns)] for _ in range(cfg.sessions)]
    system = random_tokens(rng, cfg.system_len)
    starts = poisson_arrivals(rng, len(shapes), cfg.rate)
    reqs: list[TraceRequest] = []
    for s, (turns, t) in enumerate(zip(shapes, starts)):
        history = system
        for k, (user_len, reply_len) in enumerate(turns):
            reply_len = min(reply_len, cfg.max_reply)
            prompt = np.concatenate([history, random_tokens(rng, user_len)])
            reqs.append(TraceRequest(float(t), prompt, reply_len, f"chat-{s}"))
            history = np.concatenate([prompt, random_tokens(rng, reply_len)])
            t += float(rng.exponential(cfg.think_s)) if cfg.think_s else 0.0
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
    return [reqs[i] for i in order]


def session_turns(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    """Group requests by session, keeping order (handy for checks and plots)."""
    key = lambda r: r.session or ""  # noqa: E731
    return {k: list(g) for k, g in itertools.groupby(sorted(requests, key=key), key=key)}
