"""Tensor parallelism on torch.distributed: the shard arithmetic and the forward's collectives.

Megatron's split of a Llama layer over `world` ranks (LlamaModel slices its weights with `rank`, `world`):

    q/k/v, gate/up   column-parallel: rank r holds heads [r * H / world, (r + 1) * H / world) of q and of
                     k/v (num_kv_heads % world == 0), and that share of the MLP's intermediate rows
    o, down          row-parallel: the matching input columns; each output is a partial sum, made whole
                     by one all-reduce (`TPGroup.all_reduce_`): two a layer. o_proj's bias is rank 0's.
    LM head          vocabulary-parallel: rank r holds rows [r * Vs, (r + 1) * Vs), Vs = ceil(V / world)
                     (the last share padded with zero rows); its logits are all-gathered (`gather_vocab`).
    embedding, norms replicated: the residual stream is whole on every rank.

Each rank keeps its share of KV heads in its own KVStore, with the same page ids as every other rank:
the scheduler and the radix tree live on rank 0 only (tp_workers.py sends each step's Batch to the others,
as raw int arrays: tp_frames.py).

One default process group a process (torch.distributed.init_process_group; tp_workers.py starts and
destroys it): gloo on CPU, NCCL on CUDA. The collectives are plain `dist` calls on tensors of the
compute device, so a CUDA graph captured around the forward captures them too (NCCL).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from .model_config import ModelSpec


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel engine failed (raised, died, or did not answer within dist_timeout_s).

    rank: the rank found at fault (None when no single one is). The engine's other ranks have been shut
    down: the LLM serves nothing more (close() still works); build a new one."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def check_shardable(spec: ModelSpec, world: int) -> None:
    """ValueError naming the size that `world` ranks cannot split evenly."""
    if world == 1:
        return
    for name, n in (("num_key_value_heads", spec.num_kv_heads), ("num_attention_heads", spec.num_q_heads),
                    ("intermediate_size", spec.intermediate_size)):
        if n % world:
            raise ValueError(f"tensor_parallel_size {world} must divide the model's {name} ({n}): each rank "
                             f"holds an equal share of the heads and of the MLP")


def shard_spec(spec: ModelSpec, world: int) -> ModelSpec:
    """The numbers one rank's shard has: its q and KV heads and MLP width (everything else is whole)."""
    check_shardable(spec, world)
    return dataclasses.replace(spec, num_q_heads=spec.num_q_heads // world, num_kv_heads=spec.num_kv_heads // world,
                               intermediate_size=spec.intermediate_size // world)


def vocab_share(rows: int, world: int) -> int:
    """Rows of the LM head each rank holds: ceil(rows / world) (the last rank's padded with zeros)."""
    return -(-rows // world)


def shard_vocab(lm_head: Tensor, rank: int, world: int) -> Tensor:
    """lm_head: [V, H] -> this rank's rows [ceil(V / world), H]; a view when V divides evenly."""
    V, H = lm_head.shape
    share = vocab_share(V, world)
    part = lm_head[rank * share:min(V, (rank + 1) * share)]
    if part.shape[0] == share:
        return part
    padded = lm_head.new_zeros(share, H)
    padded[:part.shape[0]] = part
    return padded


class CollectiveError(RuntimeError):
    """A collective of the forward failed: a peer closed its connection (it died) or did not join within
    the group's timeout."""


class TPGroup:
    """This process's place in the tensor-parallel group: rank, world, the device its shard lives on,
    and the collectives of the forward.

    Two process groups: torch.distributed's default one, of the device's backend (gloo on CPU, NCCL on CUDA)
    with the step timeout, carries the forward's collectives; `control` (gloo, start-up timeout: loading
    weights may take minutes) carries the agreements made while the ranks build their engines.
    A collective that fails raises `on_error(cause)`: CollectiveError by default; rank 0's TensorParallel
    installs one that names the rank at fault (TensorParallelError)."""

    def __init__(self, rank: int, world: int, device: torch.device, control: dist.ProcessGroup | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a group of {world}")
        self.rank, self.world, self.device, self.control = rank, world, device, control
        self.on_error: Callable[[BaseException], BaseException] = CollectiveError

    @staticmethod
    def init(rank: int, world: int, device: torch.device, store: dist.Store, timeout_s: float,
             start_timeout_s: float) -> TPGroup:
        """Join the groups through `store`, every rank at once. timeout_s bounds a step's collectives,
        start_timeout_s the agreements made while the engines are built."""
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; a tensor-parallel "
                               "LLM starts its own process group (one such LLM a process)")
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(timeout_s, start_timeout_s)))
        return TPGroup(rank, world, device, control)

    def _collective(self, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        try:
            fn(*args, **kwargs)
        except RuntimeError as e:  # gloo: "Connection closed by peer", "Timed out waiting ..."
            raise self.on_error(e) from e

    def all_reduce_(self, x: Tensor) -> Tensor:
        """Sum x over the ranks, in place (x contiguous); returns x."""
        self._collective(dist.all_reduce, x)
        return x

    def gather_vocab(self, logits: Tensor, rows: int) -> Tensor:
        """logits: [S, Vs] of this rank's vocabulary share -> [S, rows], every rank's shares side by side."""
        S, Vs = logits.shape
        out = logits.new_empty(self.world * S, Vs)  # [world * S, Vs]: rank r's block at rows r * S
        # all_gather_single: torch >= 2.13's name of all_gather_into_tensor
        self._collective(getattr(dist, "all_gather_single", dist.all_gather_into_tensor), out, logits.contiguous())
        return out.view(self.world, S, Vs).transpose(0, 1).reshape(S, self.world * Vs)[:, :rows]

    def min_over_ranks(self, n: int) -> int:
        """The smallest of every rank's n (e.g. the KV pages every rank has room for)."""
        t = torch.tensor([n], dtype=torch.int64)
        self._collective(dist.all_reduce, t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def barrier(self) -> None:
        """Wait, within the start-up timeout, until every rank gets here (its engine built)."""
        self._collective(dist.barrier, group=self.control)

    @staticmethod
    def close() -> None:
        """Leave the default process group (no collective: safe after a peer died)."""
        if dist.is_initialized():
            dist.destroy_process_group()
