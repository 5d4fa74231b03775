"""Batch: the one object passed from the scheduler to the model each step. No torch.

Rows are requests; tokens are the new tokens computed this step, concatenated in row order.
A decode row has q_len 1; a prefill row holds one chunk of its prompt (chunked prefill).
Before the model runs, every slot in `slots` belongs to a page in that row's page table,
and the pages listed for a row cover all `seq_lens[b]` tokens.
`page_tables[b]` may be the scheduler's own page list of that request (no copy per step): it is
valid until `Scheduler.update`, and the model must not modify it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .request import Request


@dataclass
class Batch:
    requests: list[Request]  # [B]
    input_ids: list[int]  # [T] new tokens of all rows, concatenated
    positions: list[int]  # [T] absolute position of each new token in its sequence
    q_start: list[int]  # [B] first index of row b in input_ids
    q_lens: list[int]  # [B] new tokens of row b (its LAST q_lens[b] of seq_lens[b] tokens)
    seq_lens: list[int]  # [B] tokens of row b in the KV cache once this step has run
    page_tables: list[list[int]]  # [B][ceil(seq_lens[b] / page_size)] physical page ids
    slots: list[int]  # [T] page * page_size + offset where each new token's K/V is stored
    sample: list[bool]  # [B] row b produces a token this step (decode, or last prefill chunk)
    page_size: int

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.q_lens)

    def check(self) -> None:
        """Assert the shape relations documented above (cheap; tests call it every step)."""
        B = len(self.requests)
        assert len(self.q_start) == len(self.q_lens) == len(self.seq_lens) == B
        assert len(self.page_tables) == len(self.sample) == B
        assert len(self.positions) == len(self.slots) == len(self.input_ids) == sum(self.q_lens)
        start = 0
        for b in range(B):
            assert self.q_start[b] == start, f"row {b}: q_start {self.q_start[b]} != {start}"
            assert 1 <= self.q_lens[b] <= self.seq_lens[b], f"row {b}: bad q_len {self.q_lens[b]}"
            need = -(-self.seq_lens[b] // self.page_size)
            assert len(self.page_tables[b]) >= need, f"row {b}: {len(self.page_tables[b])} pages < {need}"
            for i in range(self.q_lens[b]):
                pos = self.seq_lens[b] - self.q_lens[b] + i
                assert self.positions[start + i] == pos, f"row {b}: position {i} is not {pos}"
                page = self.page_tables[b][pos // self.page_size]
                assert self.slots[start + i] == page * self.page_size + pos % self.page_size
            start += self.q_lens[b]
