"""What `radixkv replay` prints: the summary table, and why nothing completed. No torch."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from radixkv.workloads.traces import TraceFormat
from .replay import ReplayMode, ReplayResult

if TYPE_CHECKING:
    from .fleet import FleetResult


def nothing_completed(r: ReplayResult, skipped: int) -> str:
    """Why a replay completed no request, in one line."""
    why = []
    if r.too_long:
        why.append(f"{r.too_long} longer than the model's context of {r.model_context:,} tokens")
    if r.rejected:
        why.append(f"{r.rejected} too large for the pool of {r.num_pages:,} pages x {r.page_size} tokens")
    if skipped:
        why.append(f"{skipped} malformed skipped")
    return f"no request completed of {r.requests}: " + ("; ".join(why) or "none ran")


def format_summary(r: ReplayResult, path: Path, fmt: TraceFormat, skipped: int) -> str:
    """The human summary table printed by `radixkv replay`."""
    pool = f"{r.num_pages:,} pages x {r.page_size} tokens" + (" (unlimited: never evicts)" if r.unlimited else "")
    clock = "wall" if r.mode is ReplayMode.REAL else "simulated"
    rows = [
        ("trace", f"{path} ({fmt.value})"),
        ("mode", r.mode.value),
        ("requests", f"{r.requests} ({r.completed} completed, {r.rejected} too large for the pool, "
                     + (f"{r.too_long} longer than the model's context of {r.model_context:,} tokens, "
                        if r.model_context is not None else "")
                     + f"{skipped} malformed skipped)"),
        ("prompt tokens", f"{r.prompt_tokens:,}"),
        ("cached (hit) tokens", f"{r.hit_tokens:,}"),
        ("prefix hit rate", f"{r.hit_rate:.4f}"),
        *([("hits by tier", host_tier(r))] if r.host_pages else []),
        ("KV pool", pool),
        ("peak pages in use", f"{r.peak_pages:,} ({r.peak_pages / r.num_pages:.1%} of pool)"),
        *([("live tokens at peak", fragmentation(r))]  # not measured across replicas: dropped
          if r.live_token_fraction is not None or r.contiguous_live_fraction is not None else []),
        ("preemptions", f"{r.preemptions}"),
        ("queueing delay p50/p99/max", f"{r.wait_p50_s:.3f} / {r.wait_p99_s:.3f} / {r.wait_max_s:.3f} s ({clock})"),
        ("throughput", throughput(r)),
        ("leaked pages", f"{r.leaked_pages}"),
        ("replay wall time", f"{r.wall_s:.2f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def host_tier(r: ReplayResult) -> str:
    """Hit tokens by tier and the bytes the host tier moved (the KV bytes a token: CostModel's)."""
    gb = 1e9
    return (f"GPU {r.gpu_hit_tokens:,} + host {r.host_hit_tokens:,} tokens (host tier {r.host_pages:,} pages "
            f"x {r.page_size}); moved {r.bytes_h2d / gb:,.1f} GB host->GPU, {r.bytes_d2h / gb:,.1f} GB GPU->host")


def throughput(r: ReplayResult) -> str:
    """Completed requests and tokens per second of the replay clock (wall in real mode)."""
    if r.sim_seconds <= 0:
        return "n/a"
    clock = "wall" if r.mode is ReplayMode.REAL else "simulated"
    return (f"{r.completed / r.sim_seconds:.2f} req/s, {r.prompt_tokens / r.sim_seconds:,.0f} prompt tok/s, "
            f"{r.output_tokens / r.sim_seconds:,.0f} output tok/s ({clock})")


def fragmentation(r: ReplayResult) -> str:
    """Live-token fraction of allocated KV at peak, paged and for the contiguous baseline."""
    def pct(f: float | None) -> str:
        return "n/a" if f is None else f"{f:.3%}"
    return (f"{pct(r.live_token_fraction)} of allocated KV at peak pages "
            f"(contiguous max-length reservation: {pct(r.contiguous_live_fraction)})")


def format_fleet(f: FleetResult) -> str:
    """The per-replica table `radixkv replay --replicas N` prints under the summary."""
    served = [r.requests for r in f.replicas]
    head = (f"router {f.router.value}: {len(f.replicas)} replicas (each its own KV pool as above), "
            f"requests served per replica max/mean {f.load_max_over_mean:.3f} (min {min(served)}, max {max(served)})")
    rows = [f"{'replica':>7}  {'requests':>8}  {'prompt tokens':>14}  {'hit tokens':>14}  {'hit rate':>8}  "
            f"{'peak pages':>10}  {'preemptions':>11}"]
    for i, r in enumerate(f.replicas):
        rows.append(f"{i:>7}  {r.requests:>8}  {r.prompt_tokens:>14,}  {r.hit_tokens:>14,}  {r.hit_rate:>8.4f}  "
                    f"{r.peak_pages:>10,}  {r.preemptions:>11}")
    return "\n".join([head, *rows])
