"""The engine loop's periodic throughput line (vLLM's "Avg prompt throughput: ..." log line)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixkv.engine.core import EngineStats


@dataclass
class LogWindow:
    """Token counts since the last periodic log line."""

    start: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    quiet: bool = field(default=False)

    def add(self, prompt_tokens: int, generation_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens

    def roll(self, now: float, interval: float, s: EngineStats) -> str | None:
        """The log line when `interval` has passed (None when idle twice in a row). s: the core's latest stats."""
        if now - self.start < interval:
            return None
        dt = now - self.start
        idle = not (self.prompt_tokens or self.generation_tokens or s.num_running or s.num_waiting)
        line = None
        if not (idle and self.quiet):
            line = (f"Avg prompt throughput: {self.prompt_tokens / dt:.1f} tokens/s, "
                    f"Avg generation throughput: {self.generation_tokens / dt:.1f} tokens/s, "
                    f"Running: {s.num_running} reqs, Waiting: {s.num_waiting} reqs, "
                    f"KV cache usage: {100 * s.kv_usage:.1f}%, Prefix cache hit rate: {100 * s.hit_rate:.1f}%")
        self.quiet = idle
        self.start, self.prompt_tokens, self.generation_tokens = now, 0, 0
        return line
