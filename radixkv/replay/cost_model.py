"""Step-time models for simulation: how long one Batch would take on a GPU. No torch.

Pluggable: anything with `step_seconds(batch) -> float` (the `StepTimer` protocol) can drive
the simulator. The default `CostModel` is linear in four quantities of a step:

    seconds = base_s
            + prefill_token_s * prefill_tokens       # rows computing more than one token
            + decode_token_s  * decode_tokens        # rows computing exactly one token
            + kv_read_token_s * kv_tokens_read       # sum of seq_lens: KV each row attends over
            + attn_pair_s     * attention_pairs      # sum of q_len * seq_len over prefill rows

Default constants: Llama-3-8B in BF16 on one NVIDIA H200 (4.8 TB/s HBM, ~990 dense BF16
TFLOP/s), rounded, with realistic efficiencies:
- base_s = 4e-3: read the 16 GB of weights once per step at ~4 TB/s, plus launch overhead.
- prefill_token_s = 3e-5: 2 * 8e9 FLOP per token at ~550 TFLOP/s achieved (~33k tokens/s).
- decode_token_s = 2e-5: the same matmul FLOPs at lower efficiency (small M), on top of base.
- kv_read_token_s = 3.3e-8: 128 KiB of BF16 K+V per token (32 layers x 8 KV heads x 128 x 2
  x 2 B) streamed at ~4 TB/s.
- attn_pair_s = 1.3e-12: 4 * 4096 * 32 = 0.5 MFLOP per (query, key) pair at ~400 TFLOP/s.

Host tier (issue 37, `replay --host-pages`): a prefix block loaded back from host memory is not
recomputed; it costs a PCIe copy of its KV, `transfer_seconds(tokens)` = tokens x
`kv_bytes_per_token` (131,072: the 128 KiB above) / `pcie_bytes_per_s` (50e9: PCIe 5.0 x16 achieved),
added to the step whose prefill reads it (radixkv.replay.host_tier.TransferTimer).

`ServiceTime` prices one request served alone (sequential replay's clock) under a CostModel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:  # a step's shape is read off the batch; importing batch (and request) costs start-up
    from radixkv.batch import Batch


class StepTimer(Protocol):
    def step_seconds(self, batch: Batch) -> float: ...


class StepShape(NamedTuple):
    """The quantities of a step the linear model prices."""

    prefill_tokens: int
    decode_tokens: int
    kv_tokens_read: int
    attention_pairs: int

    @classmethod
    def of(cls, batch: Batch) -> StepShape:
        prefill = decode = pairs = 0
        for q, s in zip(batch.q_lens, batch.seq_lens):
            if q == 1:
                decode += 1
            else:
                prefill += q
                pairs += q * s
        return cls(prefill, decode, sum(batch.seq_lens), pairs)


@dataclass(frozen=True)
class CostModel:
    """Linear step-time model; the defaults are the H200 / 8B model documented above."""

    base_s: float = 4e-3
    prefill_token_s: float = 3e-5
    decode_token_s: float = 2e-5
    kv_read_token_s: float = 3.3e-8
    attn_pair_s: float = 1.3e-12
    kv_bytes_per_token: float = 131072.0  # host tier: KV bytes a token's copy moves
    pcie_bytes_per_s: float = 50e9  # host tier: host<->device copy bandwidth

    def __post_init__(self) -> None:
        for name in ("base_s", "prefill_token_s", "decode_token_s", "kv_read_token_s", "attn_pair_s",
                     "kv_bytes_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0, got {getattr(self, name)}")
        if not self.pcie_bytes_per_s > 0:
            raise ValueError(f"CostModel.pcie_bytes_per_s must be > 0, got {self.pcie_bytes_per_s}")

    def transfer_seconds(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV between host and device."""
        return tokens * self.kv_bytes_per_token / self.pcie_bytes_per_s

    def seconds(self, shape: StepShape) -> float:
        return (self.base_s + self.prefill_token_s * shape.prefill_tokens
                + self.decode_token_s * shape.decode_tokens
                + self.kv_read_token_s * shape.kv_tokens_read
                + self.attn_pair_s * shape.attention_pairs)

    def step_seconds(self, batch: Batch) -> float:
        return self.seconds(StepShape.of(batch))


class ServiceTime:
    """Seconds to serve one request alone under a CostModel (sequential replay's clock).

    One prefill step computes the uncached prompt tokens (at least one: the last prompt token
    is always computed), attending over the whole prompt; then `max_tokens - 1` decode steps,
    the j-th reading prompt + j tokens of KV. The model is linear, so the decode steps are
    priced as that many steps at their mean context, exactly.
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def serve(self, prompt_tokens: int, hit_tokens: int, output_tokens: int) -> float:
        new = max(prompt_tokens - hit_tokens, 1)
        s = self.cost.seconds(StepShape(new, 0, prompt_tokens, new * prompt_tokens))
        steps = output_tokens - 1
        if steps > 0:
            s += steps * self.cost.seconds(StepShape(0, 1, prompt_tokens + output_tokens / 2, 0))
        return float(s)
