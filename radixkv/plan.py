"""KV memory arithmetic: bytes per token and page, weight bytes, pages and requests in a budget. No torch.

The one home of the formulas: `radixkv plan` prints them and the engine sizes its pool with them
(`KVStore.bytes_per_page`, `default_num_pages`).

    KV bytes per token = 2 (K and V) x layers x KV heads x (head_dim x element bits / 8 + scale bytes)

FP8 rows carry one float16 scale per (token, KV head) (kv_store.py says why); INT4 / INT2 rows a float16
(scale, zero) pair per group of head_dim / kv_int_groups(...) values (radixkv/kernels/intq.py: int4
groups of 64 values, of 16 up to head_dim 64; int2 groups of 32); other dtypes none. At head_dim 128 a
token-head's K (or V) row is 256 bytes in bf16, 130 in fp8, 72 in int4 (64 + 2 groups x 4), 48 in int2
(32 + 4 x 4); at head_dim 64: 128 in bf16, 66 in fp8, 48 in int4 (32 + 4 x 4), 24 in int2 (16 + 2 x 4).
Llama 3.1 70B (80 layers, 8 KV heads, head_dim 128) at BF16: 327,680 bytes = 320 KiB a token; the
same model with 64 full KV heads holds 4096 tokens x 16 requests in 160.00 GiB of FP16.

Budget: the KV pool gets `utilization` of the memory left after the weights, less what one step's
activations and logits need (`step_reserve_bytes`), in whole pages; int4 / int2 pages also leave room for
their recent-token window's shadow pages (`kv_window_bytes`, radixkv/engine/kv_window.py). A request of C tokens holds
ceil(C / page_size) pages at its peak, so peak concurrency is pages // that.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from radixkv.config import KVDtype

if TYPE_CHECKING:
    from radixkv.model_shape import ModelShape

FP8_SCALE_BYTES = 2  # float16, one per (token, KV head) row
INT_GROUP_BYTES = 4  # float16 scale + float16 zero, one pair per group of a row
INT_GROUP_SIZE = {4: 64, 2: 32}  # values a group holds where head_dim allows (bits -> values)
# up to SMALL_HEAD_DIM: int4 keys of SmolLM2-135M (head_dim 64) need groups of 16 (outlier channels;
# benchmarks/RESULTS.md); larger heads keep 64, the byte budget of the H200 decode target
SMALL_HEAD_DIM = 64
INT_GROUP_SIZE_SMALL_HEAD = {4: 16, 2: 32}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


# ---- the formulas ------------------------------------------------------------------------------
def kv_int_groups(head_dim: int, kv_dtype: str | KVDtype) -> int:
    """Groups of an INT4 / INT2 row of head_dim values (each a float16 scale and zero): head_dim // the
    group size rounded down to a power of two dividing head_dim (radixkv/kernels/intq.py's format: whole
    bit-planes or whole groups a plane). The group size: INT_GROUP_SIZE_SMALL_HEAD up to head_dim
    SMALL_HEAD_DIM, INT_GROUP_SIZE above, where groups stay whole bit-planes (at most 8 // bits groups, so
    paged_decode folds the scales into its scores). int4: 4 at head_dim 64 (groups of 16), 2 at 128 (64); int2:
    2 at 64 (32), 4 at 128 (32).
    ValueError if head_dim is not a multiple of 8 // bits (the values a byte holds)."""
    kd = KVDtype.parse(kv_dtype)
    if not kd.is_int:
        raise ValueError(f"kv_int_groups: {kd.value} is not an integer KV dtype")
    per_byte = 8 // kd.bits
    if head_dim < 1 or head_dim % per_byte:
        raise ValueError(f"{kd.value} KV needs head_dim a multiple of {per_byte}, got {head_dim}")
    small = head_dim <= SMALL_HEAD_DIM
    size = (INT_GROUP_SIZE_SMALL_HEAD if small else INT_GROUP_SIZE)[kd.bits]
    most = head_dim // size if small else min(per_byte, head_dim // size)  # larger heads: whole planes
    groups = 1
    while groups * 2 <= most and head_dim % (groups * 2) == 0:
        groups *= 2
    return groups


def kv_dtype_fits(head_dim: int, kv_dtype: str | KVDtype) -> bool:
    """Whether rows of head_dim values can be stored in kv_dtype (INT4 / INT2 need whole bytes)."""
    kd = KVDtype.parse(kv_dtype)
    return not kd.is_int or head_dim % (8 // kd.bits) == 0


def kv_row_bytes(head_dim: int, kv_dtype: str | KVDtype) -> int:
    """Bytes of one token's K (or V) row of one KV head, its scales (and zeros) included."""
    kd = KVDtype.parse(kv_dtype)
    if kd.is_int:
        return head_dim * kd.bits // 8 + kv_int_groups(head_dim, kd) * INT_GROUP_BYTES
    return head_dim * kd.itemsize + (FP8_SCALE_BYTES if kd.is_fp8 else 0)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str | KVDtype) -> int:
    """K and V bytes of one token over every layer."""
    return 2 * num_layers * num_kv_heads * kv_row_bytes(head_dim, kv_dtype)


def kv_bytes_per_page(page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                      kv_dtype: str | KVDtype) -> int:
    return page_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, kv_dtype)


def pages_in_budget(budget_bytes: int, bytes_per_page: int) -> int:
    """Whole pages that fit in budget_bytes (0 if not even one)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    return int(budget_bytes) // bytes_per_page


def kv_budget_bytes(free_after_weights: int, utilization: float, reserve: int) -> int:
    """Bytes the KV pool may take: `utilization` of the memory free after the weights, less `reserve`."""
    return max(0, int(free_after_weights * utilization) - reserve)


def step_reserve_bytes(hidden_size: int, intermediate_size: int, vocab_size: int, max_batch_tokens: int,
                       max_running: int, itemsize: int) -> int:
    """Activations of a full step (the MLP is the widest) + fp32 logits of every sampling row."""
    reserve = max_batch_tokens * (4 * intermediate_size + 8 * hidden_size) * itemsize
    return reserve + min(max_running, max_batch_tokens) * vocab_size * 8


# The largest step the mixed-step graphs replay (engine/piecewise_graphs.py). Past 1024 tokens a step is eager:
# its launches hide behind ~30 ms of device work, and a bucket's padding would cost more (H200, Llama-3-8B:
# benchmarks/RESULTS.md)
MIXED_GRAPH_MAX_TOKENS = 1024


def graph_reserve_bytes(hidden_size: int, intermediate_size: int, vocab_size: int, max_rows: int,
                        mixed_tokens: int, itemsize: int) -> int:
    """What CUDA graphs hold beside an eager step's memory (engine/cuda_graphs.py, piecewise_graphs.py):
    the decode graphs' pool (one step's activations and its 16-bit logits at max_rows rows: the graphs share
    it), their one fp32 logits buffer [max_rows, V], and the mixed-step graphs' pool and static buffers at
    mixed_tokens tokens (0: none)."""
    per_token = (4 * intermediate_size + 8 * hidden_size) * itemsize
    decode = max_rows * (per_token + vocab_size * (itemsize + 4))
    return decode + mixed_tokens * (per_token + 4 * hidden_size * itemsize)


def engine_reserve_bytes(hidden_size: int, intermediate_size: int, vocab_size: int, max_batch_tokens: int,
                         max_running: int, itemsize: int, graphs: bool = True) -> int:
    """What the engine keeps out of the KV budget (kv_store.default_num_pages; `radixkv plan` the same): an
    eager step's memory and, with CUDA graphs, theirs (the mixed-step graphs' counted even where a window
    keeps them from being built)."""
    reserve = step_reserve_bytes(hidden_size, intermediate_size, vocab_size, max_batch_tokens, max_running, itemsize)
    if graphs:
        reserve += graph_reserve_bytes(hidden_size, intermediate_size, vocab_size, max_running,
                                       min(max_batch_tokens, MIXED_GRAPH_MAX_TOKENS), itemsize)
    return reserve


# KIVI's full-precision window of recent tokens (radixkv/engine/kv_window.py): INT pages take one by default
DEFAULT_KV_WINDOW = 16


def kv_window_for(kv_dtype: str | KVDtype, kv_window: int | None = None) -> int:
    """The recent-token window an engine runs: kv_window when given (0: none), else DEFAULT_KV_WINDOW for
    INT4 / INT2 pages and none for the others (EngineConfig checks kv_window)."""
    if kv_window is not None:
        return kv_window
    return DEFAULT_KV_WINDOW if KVDtype.parse(kv_dtype).is_int else 0


# Attention sinks kept beside the window: a sequence's first tokens, which draw much of every query's attention
DEFAULT_KV_SINK = 16


def kv_sink_for(kv_dtype: str | KVDtype, window: int, page_size: int, kv_sink: int | None = None) -> int:
    """The sink an engine runs (tokens at the start of every sequence read in full precision with the
    window): kv_sink when given, else DEFAULT_KV_SINK rounded up to whole pages for INT4 / INT2 pages with
    a window and none otherwise. ValueError for a sink that is not whole pages, or one without a window."""
    if kv_sink is None:
        if window == 0 or not KVDtype.parse(kv_dtype).is_int:
            return 0
        return -(-DEFAULT_KV_SINK // page_size) * page_size
    if isinstance(kv_sink, bool) or not isinstance(kv_sink, int) or kv_sink < 0 or kv_sink % page_size:
        raise ValueError(f"kv_sink must be an int >= 0 and a multiple of the page size {page_size}, got {kv_sink!r}")
    if kv_sink and window == 0:
        raise ValueError(f"kv_sink={kv_sink} needs a recent-token window (kv_window >= 1): the window reads it")
    return kv_sink


def window_pages_per_row(window: int, page_size: int, sink: int = 0) -> int:
    """The most shadow pages one row of a step maps for a window: its sink, its read run and its tail run."""
    return sink // page_size + 2 * (-(-(window - 1) // page_size) + 1)


def kv_window_bytes(window: int, page_size: int, max_rows: int, num_layers: int, num_kv_heads: int,
                    head_dim: int, itemsize: int, sink: int = 0) -> int:
    """Bytes of a window's shadow pages (K and V, every layer, one scratch page) in the compute dtype; 0
    without a window."""
    if window == 0:
        return 0
    pages = max_rows * window_pages_per_row(window, page_size, sink) + 1
    return 2 * num_layers * pages * page_size * num_kv_heads * head_dim * itemsize


def pages_per_request(context: int, page_size: int) -> int:
    return -(-context // page_size)


def window_rows(budget: int, per_page: int, row_bytes: int, scratch_bytes: int, max_rows: int,
                tokens_per_row: int, page_size: int) -> int:
    """How many running rows a recent-token window reserves shadow pages for (row_bytes each, scratch_bytes
    once): the most, up to max_rows, for which the pages left in `budget` after their windows still hold that
    many rows of tokens_per_row tokens; 0 when not even one. Reserving for rows that could never hold their
    tokens only takes pages from the ones that can (an INT4 pool would get fewer requests than FP8's)."""
    need = pages_per_request(tokens_per_row, page_size)

    def fits(rows: int) -> bool:
        left = budget - scratch_bytes - rows * row_bytes
        return left >= 0 and left // per_page >= rows * need

    lo, hi = 0, max_rows  # fits(rows) only turns false as rows grow: the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def kv_pool_split(budget: int, per_page: int, window: int, page_size: int, max_rows: int, tokens_per_row: int,
                  num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int, sink: int = 0) -> tuple[int, int]:
    """(KV pages, window rows) of `budget` bytes: without a window every byte is pages and max_rows run; with
    one, window_rows decides the rows whose shadow pages come out of the budget first. `radixkv plan` (at its
    context) and the engine (kv_store.default_num_pages, at max_model_len or 512 tokens a row) both size here."""
    if window == 0:
        return pages_in_budget(budget, per_page), max_rows
    scratch = kv_window_bytes(window, page_size, 0, num_layers, num_kv_heads, head_dim, itemsize, sink)
    row = kv_window_bytes(window, page_size, 1, num_layers, num_kv_heads, head_dim, itemsize, sink) - scratch
    # at least one row when its window fits (a request longer than the pool is the prompt limits' business)
    rows = window_rows(budget, per_page, row, scratch, max_rows, tokens_per_row, page_size) or int(
        budget >= scratch + row + per_page)
    left = budget - kv_window_bytes(window, page_size, rows, num_layers, num_kv_heads, head_dim, itemsize, sink)
    return pages_in_budget(max(0, left), per_page), rows


# ---- the plan ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVPlanRow:
    """One KV dtype's figures."""

    kv_dtype: str
    bytes_per_token: int
    bytes_per_page: int
    pages: int  # in the budget
    tokens: int  # pages x page_size
    max_requests: int  # at `context` tokens each, all at their peak at once
    load_bytes: int  # KV of `batch` requests of `context` tokens (whole pages)
    load_fits: bool
    window_bytes: int = 0  # shadow pages of the dtype's default recent-token window for the requests that fit
    window_rows: int = 0  # the running rows those shadow pages are for (kv_pool_split); 0 without a window


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    dtype: str
    weight_bytes: int
    gpu_memory: int
    utilization: float
    reserve_bytes: int
    kv_budget_bytes: int
    page_size: int
    context: int
    batch: int
    load_tokens: int
    rows: list[KVPlanRow]

    @property
    def chosen(self) -> KVPlanRow:
        """The row --json's flat keys describe: the one KV dtype asked for (the first of several), else the
        model's own dtype."""
        if len(self.rows) == 1:
            return self.rows[0]
        own = KVDtype.for_compute(self.dtype).value
        return next((r for r in self.rows if r.kv_dtype == own), self.rows[0])

    def to_json(self) -> dict[str, Any]:
        """DESIGN's keys for the chosen KV dtype (sizes in bytes), then every field, `rows` holding each dtype."""
        r = self.chosen
        flat = {"kv_dtype": r.kv_dtype, "kv_bytes_per_token": r.bytes_per_token, "kv_bytes_per_page": r.bytes_per_page,
                "weight_bytes": self.weight_bytes, "kv_budget_bytes": self.kv_budget_bytes, "max_pages": r.pages,
                "max_tokens": r.tokens, "max_concurrency": r.max_requests, "load_kv_bytes": r.load_bytes}
        return flat | asdict(self)


def plan_memory(shape: ModelShape, gpu_memory: int, utilization: float = 0.9, page_size: int = 16,
                context: int = 4096, batch: int = 16, dtype: str | None = None,
                kv_dtypes: list[str] | None = None, max_batch_tokens: int = 8192,
                max_running: int = 256) -> MemoryPlan:
    """The figures `radixkv plan` prints, for each KV dtype (default: every one the engine has that
    fits the model's head_dim)."""
    for name, v in (("page_size", page_size), ("context", context), ("batch", batch), ("gpu_memory", gpu_memory)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
    dtype = dtype or shape.dtype
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    itemsize = DTYPE_BYTES[dtype]
    weights = shape.num_params * itemsize
    reserve = engine_reserve_bytes(shape.hidden_size, shape.intermediate_size, shape.vocab_size, max_batch_tokens,
                                   max_running, itemsize)
    budget = kv_budget_bytes(max(0, gpu_memory - weights), utilization, reserve)
    per_req = pages_per_request(context, page_size)
    rows = []
    for kv in kv_dtypes or [k.value for k in KVDtype if kv_dtype_fits(shape.head_dim, k)]:
        kd = KVDtype.parse(kv)
        per_token = shape.kv_bytes_per_token(kd)
        per_page = page_size * per_token
        w, geometry = kv_window_for(kd), (shape.num_layers, shape.num_kv_heads, shape.head_dim, itemsize)
        sink = kv_sink_for(kd, w, page_size)
        # as the engine sizes its pool (kv_store.default_num_pages), at this plan's context a request
        pages, runnable = kv_pool_split(budget, per_page, w, page_size, max_running, context, *geometry, sink)
        window = kv_window_bytes(w, page_size, runnable, *geometry, sink)
        most = min(pages // per_req, runnable) if w else pages // per_req  # a window runs no more than its rows
        load = batch * per_req * per_page
        fits = batch <= most if w else load <= budget
        rows.append(KVPlanRow(kd.value, per_token, per_page, pages, pages * page_size, most, load, fits, window,
                              runnable if w else 0))
    return MemoryPlan(shape.name, dtype, weights, gpu_memory, utilization, reserve, budget, page_size, context,
                      batch, batch * context, rows)


def parse_bytes(text: str) -> int:
    """'80GiB', '141 GB', '1.5TiB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None:
        raise ValueError(f"cannot read {text!r} as a memory size (e.g. 80GiB, 141GB, 1.5TiB)")
    value = float(m.group(1)) * unit
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"memory size {text!r} must be at least one byte")
    return int(value)


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def format_plan(p: MemoryPlan) -> str:
    """The table `radixkv plan` prints."""
    lines = [f"{'model':<28}{p.model}",
             f"{'weights':<28}{gib(p.weight_bytes)} ({p.dtype})",
             f"{'GPU memory':<28}{gib(p.gpu_memory)} x {p.utilization} of what the weights leave, "
             f"less {gib(p.reserve_bytes)} for a step and its graphs",
             f"{'KV budget':<28}{gib(p.kv_budget_bytes)}",
             f"{'load':<28}{p.batch} requests x {p.context:,} tokens = {p.load_tokens:,} tokens "
             f"(page {p.page_size})",
             "",
             f"{'kv dtype':<10}{'bytes/token':>13}{'bytes/page':>13}{'pages':>13}{'tokens':>15}"
             f"{'max requests':>14}{'load needs':>14}{'fits':>6}"]
    for r in p.rows:
        lines.append(f"{r.kv_dtype:<10}{r.bytes_per_token:>13,}{r.bytes_per_page:>13,}{r.pages:>13,}"
                     f"{r.tokens:>15,}{r.max_requests:>14,}{gib(r.load_bytes):>14}{'yes' if r.load_fits else 'no':>6}")
    return "\n".join(lines)
