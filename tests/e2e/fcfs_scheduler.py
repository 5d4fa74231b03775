"""A minimal FCFS scheduler with the Scheduler interface: the engine's stand-in in tests
until radixkv.scheduler lands (no chunked prefill, no preemption)."""
from __future__ import annotations

from radixkv.batch import Batch
from radixkv.pages import OutOfPages
from radixkv.request import Request, Status


class FcfsScheduler:
    def __init__(self, pool, cache, config, page_size: int) -> None:
        self.pool, self.cache, self.config, self.ps = pool, cache, config, page_size
        self.waiting: list[Request] = []
        self.running: list[Request] = []

    def add(self, req: Request, now: float) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _pages_for(self, n: int) -> int:
        return -(-n // self.ps)

    def _alloc(self, n: int) -> list[int]:
        if n > self.pool.num_free:
            self.cache.evict(n - self.pool.num_free)
        return self.pool.alloc(n)

    def schedule(self, now: float) -> Batch | None:
        rows: list[tuple[Request, int]] = []  # (request, q_len)
        for r in self.running:
            if self._pages_for(r.num_tokens) > len(r.pages):
                r.pages += self._alloc(1)
            rows.append((r, 1))
        budget = self.config.max_batch_tokens
        while self.waiting and len(self.running) < self.config.max_running:
            r = self.waiting[0]
            m = self.cache.match(r.prompt[:-1])
            new = len(r.prompt) - m.num_tokens
            if new > budget:
                break
            self.pool.incref(m.pages)
            try:
                own = self._alloc(self._pages_for(len(r.prompt)) - len(m.pages))
            except OutOfPages:
                self.pool.decref(m.pages)
                break
            self.waiting.pop(0)
            budget -= new
            r.pages = list(m.pages) + own
            r.num_computed = r.cached_tokens = m.num_tokens
            r.status = Status.RUNNING
            self.running.append(r)
            rows.append((r, new))
        if not rows:
            return None
        b = Batch([], [], [], [], [], [], [], [], [], self.ps)
        for r, q in rows:
            seq = r.num_tokens
            b.requests.append(r)
            b.q_start.append(len(b.input_ids))
            b.q_lens.append(q)
            b.seq_lens.append(seq)
            b.page_tables.append(list(r.pages))
            b.sample.append(True)
            for pos in range(seq - q, seq):
                b.input_ids.append(r.tokens[pos])
                b.positions.append(pos)
                b.slots.append(r.pages[pos // self.ps] * self.ps + pos % self.ps)
        b.check()
        return b

    def update(self, batch: Batch, tokens: list, now: float) -> list[Request]:
        done = []
        for r, seq, t in zip(batch.requests, batch.seq_lens, tokens):
            r.num_computed = seq
            if t is not None and r.append_token(t):
                full = r.num_computed // self.ps
                self.cache.insert(r.tokens[:full * self.ps], r.pages[:full])
                self.pool.decref(r.pages)
                r.pages = []
                r.status = Status.FINISHED
                self.running.remove(r)
                done.append(r)
        return done
