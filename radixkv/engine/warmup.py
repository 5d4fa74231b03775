"""Warm before ready: compile every Triton specialisation and capture every CUDA graph a served request can
reach, before `LLM(...)` returns and before the server's core process reports ready.

`warm_up(core)` drives the EngineCore with synthetic token-id requests (their own request ids, never a
front end's, and no seed drawn from the engine's stream), then leaves no trace: every request ends, the
prefix cache is emptied (every page back in the pool) and every counter the steps moved is back at 0
(EngineStats' num_steps, mixed_steps; the scheduler's metrics: prompt/hit tokens, preemptions, waits;
steps_ahead; the graphs' (decode and piecewise) and attention's replay and cascade counters). `prepare_engine(core)` runs it
when EngineConfig.warmup says so (None: on CUDA only; Triton's interpreter makes it slow on CPU) and logs
the start-up lines (KV dtype, pages x page size = tokens, concurrent requests at max_model_len, max_num_seqs
and cascade as decided (EngineConfig.with_engine_defaults), graphs, warm-up seconds). `use_radixkv_triton_cache()` points TRITON_CACHE_DIR (when unset) at
`$RADIXKV_CACHE_DIR/triton`, default `~/.cache/radixkv/triton`, so compiled kernels survive restarts.

What a step's kernels specialise on (kernels/*.py, engine/attention.py, cuda_graphs.py). Triton compiles a
kernel once per distinct set of constexprs, and per class of every plain int argument: == 1 (made a
constant), divisible by 16, or other (and i64 past 2**31); pointers by 16-byte alignment, which every
tensor a step hands the kernels has (attention.plan uploads a mixed step's split rows as parts of their own:
the views at a row offset they were before compiled new specialisations mid-run, ~0.2 s each, in ShareGPT's
big mixed steps). The page table's row stride W is a multiple of 16 (attention.plan pads it), so the
probes of W's classes below all meet the one class. Everything fixed by the model and the KV dtype (heads, head_dim, page
size, tiles by dtype, window and sink, strides of the fused QKV rows) is the same for every step. What
varies with a step, and what the warm-up therefore covers:

Mixed steps of up to 1,024 tokens replay piecewise graphs (piecewise_graphs.py: every token bucket captured at
start-up, so their norms, RoPE, MLP and stores are compiled there), with attention run eagerly between the
pieces on the step's real rows: the attention below is what such a step can still meet for the first time.

1. Prefill / extend attention (paged_prefill, its Hopper Gluon kernel, the INT kernel): the tile tier by
   the longest new-token row (<= 64, <= 128, more: launch.PREFILL_*_BY_LEN, and the Hopper kernel above 64
   new tokens on sm_90) and the page table's row stride, i.e. the widest row's page count W (1, a multiple
   of 16, other). A single request per probe, with new tokens q in each tier (37, 100, 200) and W in each
   class, reached by a cached prefix c (a multiple of the page size, so it is a real prefix-cache hit):
   c + q lands in page W. With a recent-token window (INT pages) the page attention reads a table W - sink
   pages wide (and window_attention the full one), so W - sink pages is put in each class too.
2. The token count T of an eager step (past the piecewise buckets, or without them), which rms_norm takes as an
   int (rows = T x heads): T = 1 (a prompt whose
   every page but its last token is cached: a re-sent prompt), a multiple of 16 (48, 128) and other; the
   sampling rows S likewise (the final norm): single requests (S = 1) and the decode batches below.
3. Fresh prompts and long ones: a 37-token prompt first (the shape the issue measured), then one long
   prompt, chunked at max_batch_tokens (its first chunk a full budget, the next an extend over it), that
   also becomes the cached prefix every later probe reads (so long contexts cost one prefill).
4. Decode: with CUDA graphs, one graph per (batch bucket, split count rounded up to a power of two); the
   split count grows with the longest context (dispatch.choose_num_splits), so capture_all's short-context
   graphs leave the longer ones to first use. Every (bucket, splits) key reachable within max_model_len
   (and the pool) is stepped: `bucket` rows, one of them on a cached prefix of the context that picks the
   splits, the rest two-token prompts. Without graphs (enforce_eager), each distinct eager signature:
   the split count's class (1 / 16k / other) and its merge tile (next power of two), the table width's
   class, and FP8's wide-launch register cap. Each such batch also prefills its rows in one step (a mixed
   step: one extend row with many short prompts, S = rows).
5. Sampler: greedy rows (argmax), unfiltered sampled rows (gumbel_argmax, whose split count, merge tile
   and partial flag depend on S: every distinct signature for S up to max_num_seqs gets a batch of S
   rows), filtered rows (top-k, top-p, min-p: nucleus_draw), logprobs, penalties and min_tokens.
6. Mixed steps: decode rows running while a fresh prompt's chunk is admitted. With CUDA graphs a mixed step's
   leading decode rows run paged_decode eagerly (attention.py's MixedSplit), so each eager decode signature of
   item 4 is also stepped as the decode rows of a mixed step (37 new tokens beside them).
7. Cascade (cascade=True, a rule that takes groups): batches of rows sharing a cached prefix of the rule's
   floor (rows, tokens), one per cascade bucket from the floor up, and a two-level batch (two groups over
   one outer prefix); capture_all/warm_cascade already captured the keys reachable on padding rows.

What it cannot cover: kernels whose specialisation depends on what no synthetic batch within the pool and
max_model_len reaches (a pool too small for the longest context or the largest bucket skips those probes,
logged at debug); an eager cascade step of more groups than the graphs hold (it needs more distinct shared
prefixes than a warm-up should build); prompt logprobs; the cuBLAS heuristics of GEMM shapes never run
(a first call of a new M is not a compile, a few microseconds). Tensor-parallel workers warm through the
same steps (they run every step's forward).
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from radixkv.kernels import dispatch
from radixkv.request import Request
from radixkv.sampling_params import RequestSampling, SamplingParams
from radixkv.scheduler.metrics import SchedulerMetrics

from .core import EngineCore
from .cuda_graphs import batch_buckets
from .gguf import CACHE_ENV

log = logging.getLogger(__name__)

_RID_BASE = 1 << 60  # synthetic request ids: far above any front end's counter
_SEED = 0x5EED  # the token ids' and sampled rows' seeds (a local generator: no global RNG is touched)
_MAX_DECODE_PHASES = 160  # a bound on the decode batches (graph keys / eager signatures) stepped
# prefill tile tiers by the longest new-token row (launch.PREFILL_*_BY_LEN; the Hopper kernel above 64):
# (fewest new tokens of the tier, the probes' count); the tiers end at 64, 128 and the budget
_TIERS = ((1, 37), (65, 100), (129, 200))


@dataclass(frozen=True)
class WarmupReport:
    """What warm_up did: wall seconds, engine steps run, the shapes it covered (one label each, e.g.
    "extend c=48 q=200 W=16", "decode rows=64 ctx=4094") and the CUDA graphs it captured."""

    seconds: float
    steps: int
    shapes: tuple[str, ...]
    graphs_captured: int = 0


# ---------------------------------------------------------------------- start-up


def radixkv_cache_root() -> str:
    """radixkv's cache folder: $RADIXKV_CACHE_DIR, default ~/.cache/radixkv (GGUF conversions live there too)."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "radixkv")


def use_radixkv_triton_cache() -> str:
    """Point Triton's kernel cache at `<radixkv cache>/triton` unless TRITON_CACHE_DIR is set (call before any
    kernel compiles; Triton reads the variable at each compile); returns the folder in use."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = os.path.join(radixkv_cache_root(), "triton")
    return os.environ["TRITON_CACHE_DIR"]


def warmup_enabled(core: EngineCore) -> bool:
    """EngineConfig.warmup, or (None) whether the model runs on a CUDA device."""
    flag = core.config.warmup
    return core.runner.device.type == "cuda" if flag is None else flag


def prepare_engine(core: EngineCore, *, budget_given: bool = False) -> WarmupReport | None:
    """What a front end runs once its EngineCore is built, before it serves: refuse an explicitly given
    per-step budget larger than the pool (EngineConfig.check_budget_fits), warm up when enabled, and log
    the start-up lines. Returns the warm-up's report (None when it was off)."""
    if budget_given:
        core.config.check_budget_fits(core.runner.num_pages)
    decided = getattr(core.runner, "config", core.config).scheduler
    if core.config.scheduler != decided:  # a front end built its core from the config it passed, not runner.config
        log.warning("the engine core's scheduler config differs from the runner's decided one (max_num_seqs %d vs "
                    "%d, cascade %s vs %s): build EngineCore(runner, runner.config)", core.config.scheduler.max_running,
                    decided.max_running, core.config.scheduler.cascade, decided.cascade)
    report = warm_up(core) if warmup_enabled(core) else None
    for line in startup_lines(core, report):
        log.info("%s", line)
    return report


def startup_lines(core: EngineCore, report: WarmupReport | None) -> list[str]:
    """The start-up log lines: KV dtype and pool, requests that fit at max_model_len, graphs, warm-up."""
    runner, cfg = core.runner, core.config
    pages, ps = runner.num_pages, cfg.page_size
    max_len = runner.limits.max_model_len
    per_request = -(-max_len // ps)
    graphs = runner.graphs
    kv = f"KV cache: {runner.kv_dtype.value}, {pages:,} pages x {ps} tokens = {pages * ps:,} tokens"
    sched = cfg.scheduler
    fit = (f"max concurrent requests at max_model_len {max_len:,}: {pages // per_request:,} "
           f"({per_request:,} pages each); max_num_seqs {sched.max_running}"
           f"{' (engine default from the KV pool)' if cfg.auto_max_num_seqs else ''}; cascade decode "
           f"{'on: the KV dtype rule decides each step' if sched.cascade else 'off'}"
           f"{' (engine default)' if cfg.auto_cascade else ''}")
    mixed = getattr(runner, "mixed_graphs", None)
    pieces = (f"; mixed steps: {len(mixed.buckets)} token buckets of piecewise graphs"
              if mixed is not None and getattr(mixed, "use_graphs", False) else "")
    lines = [kv, fit, f"CUDA graphs captured: {graphs.num_graphs} decode{pieces}" if graphs is not None
             else "CUDA graphs: none (eager steps)"]
    if report is None:
        lines.append("warm-up: off")
    else:
        lines.append(f"warm-up: {report.seconds:.2f} s, {report.steps} steps, {len(report.shapes)} shapes, "
                     f"{report.graphs_captured} graphs captured")
    return lines


# ---------------------------------------------------------------------- the warm-up


def warm_up(core: EngineCore) -> WarmupReport:
    """Drive `core` through every shape the module docstring lists, then leave no trace (requests ended,
    prefix cache empty, counters at 0). Runs on any device; a probe the pool or the context cannot hold is
    skipped. Raises what a step raises (the engine is then not fit to serve)."""
    t0 = time.perf_counter()
    graphs = core.runner.graphs
    before = graphs.num_graphs if graphs is not None else 0
    w = _Warmup(core)
    try:
        w.run_all()
    finally:
        w.end_all()
        _reset(core)
    report = WarmupReport(time.perf_counter() - t0, w.steps, tuple(w.shapes),
                          (graphs.num_graphs - before) if graphs is not None else 0)
    log.debug("warm-up shapes: %s", "; ".join(report.shapes))
    return report


def _reset(core: EngineCore) -> None:
    """Empty the prefix cache and zero every counter the warm-up moved."""
    core.reset_prefix_cache()
    core.num_steps = core.mixed_steps = core.steps_ahead = 0
    old = core.scheduler.metrics
    core.scheduler.metrics = SchedulerMetrics(timeline_limit=old.timeline_limit)
    graphs, attn = core.runner.graphs, core.runner.attention
    if graphs is not None:
        graphs.replays = graphs.cascade_replays = 0
    mixed = getattr(core.runner, "mixed_graphs", None)  # piecewise graphs of mixed steps (piecewise_graphs.py)
    if mixed is not None:
        mixed.replays = 0
    attn.cascade_steps = attn.two_level_steps = 0
    if core.pool.num_free != core.pool.num_pages:  # a bug elsewhere: say so, do not hide it
        log.warning("warm-up left %d of %d KV pages in use", core.pool.num_pages - core.pool.num_free,
                    core.pool.num_pages)


def _width_class(w: int) -> str:
    """Triton's class of an int argument: '1', '16k' or 'other'."""
    return "1" if w == 1 else "16k" if w % 16 == 0 else "other"


def _first_in_class(lo: int, cls: str) -> int | None:
    """The smallest width >= lo (lo >= 1) in Triton's class `cls`; None when '1' is below lo."""
    if cls == "1":
        return 1 if lo <= 1 else None
    if cls == "16k":
        return -(-lo // 16) * 16
    w = max(lo, 2)
    return w + 1 if w % 16 == 0 else w


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class _Warmup:
    """One warm-up run over an EngineCore: the probes (run_all) and the requests they made."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        runner, cfg = core.runner, core.config
        self.ps = cfg.page_size
        self.budget = cfg.scheduler.max_batch_tokens
        self.max_rows = cfg.scheduler.max_running
        limits = runner.limits
        cap = limits.max_model_len
        if limits.sliding_window:
            cap = min(cap, limits.sliding_window)
        self.max_len = cap
        self.vocab = limits.vocab_size
        self.pages = runner.num_pages
        self.sink_pages = (runner.kv_sink // self.ps) if runner.kv_window else 0
        self.window = bool(runner.kv_window)
        self.rng = random.Random(_SEED)
        self.next_rid = _RID_BASE
        self.live: list[Request] = []
        self.steps = 0
        self.shapes: list[str] = []
        self.base: list[int] = []  # the long prompt every cached prefix is cut from

    # ------------------------------------------------------------ requests and phases

    def tokens(self, n: int) -> list[int]:
        lo = min(3, self.vocab - 1)  # clear of the usual pad/bos/eos ids where the vocabulary allows
        return [self.rng.randrange(lo, self.vocab) for _ in range(n)]

    def request(self, prompt: Sequence[int], params: SamplingParams, max_tokens: int) -> Request:
        rid = self.next_rid
        self.next_rid += 1
        max_tokens = max(1, min(max_tokens, self.max_len - len(prompt)))
        return Request(rid=rid, prompt=list(prompt), max_tokens=max_tokens, arrival_s=self.core.now(),
                       sampling=RequestSampling(params, seed=_SEED + rid - _RID_BASE))

    def fits(self, lengths: Sequence[int], out: int, shared: int = 0) -> bool:
        """Whether prompts of `lengths` (+ `out` tokens each, after `shared` prefix tokens they all share)
        fit the context and, all at once, the pool."""
        if not lengths or shared + max(lengths) + out > self.max_len:
            return False
        need = shared // self.ps + sum(-(-(n + out) // self.ps) + 1 for n in lengths)
        return need <= self.pages - 1

    def phase(self, label: str, reqs: Sequence[Request], decode_steps: int = 2,
              then: Callable[[], Sequence[Request]] | None = None) -> bool:
        """Queue `reqs`, step until every prompt is computed, run `decode_steps` more steps (after adding
        `then()`'s requests, when given: a mixed step), and end them all. False (and nothing run) when the
        scheduler refuses a request (it cannot fit the pool)."""
        core = self.core
        try:
            core.add(list(reqs))
        except ValueError as err:
            log.debug("warm-up: skipped %s (%s)", label, err)
            return False
        self.live.extend(reqs)
        budget_steps = 8 + sum(len(r.prompt) for r in reqs) // max(1, self.budget) + len(reqs)
        for _ in range(budget_steps):
            if all(r.finished or r.num_computed >= len(r.prompt) for r in reqs):
                break
            self.step()
        if then is not None:
            late = list(then())
            core.add(late)
            self.live.extend(late)
            reqs = [*reqs, *late]
        for _ in range(decode_steps):
            if all(r.finished for r in reqs):
                break
            self.step()
        self.end_all()
        self.shapes.append(label)
        return True

    def step(self) -> None:
        self.core.step()
        self.steps += 1

    def end_all(self) -> None:
        """Abort every synthetic request still live and let a step scheduled ahead of them go."""
        for r in self.live:
            if not r.finished:
                self.core.abort(r.rid)
        self.live.clear()
        if not self.core.has_work():
            self.core.step()  # drops a step queued ahead of the aborted rows (nothing else to run)

    # ------------------------------------------------------------ the probes

    def run_all(self) -> None:
        greedy = SamplingParams(temperature=0.0, ignore_eos=True)
        self.phase("fresh q=37", [self.request(self.tokens(min(37, self.max_len - 2)), greedy, 2)])
        extends = self.extend_probes()
        decodes = self.decode_probes()
        longest = max([c for c, _ in extends] + [n for _, n in decodes] + [self.budget + self.ps + 1], default=0)
        self.cache_base(longest)
        for c, q in extends:
            self.extend(c, q)
        for rows, ctx in decodes:
            self.decode(rows, ctx)
        self.sampler_probes(sorted({rows for rows, _ in decodes}))
        self.mixed(min(8, max(1, self.max_rows - 1)), 2, 200)
        attn = self.core.runner.attention
        if self.core.runner.graphs is not None and getattr(attn, "split_mixed", False) and attn.window is None:
            for rows, ctx in self.decode_probes(eager=True):  # a mixed step's decode rows run paged_decode eagerly
                self.mixed(min(rows, self.max_rows - 1), ctx, 37)
        self.cascade()

    def cache_base(self, longest: int) -> None:
        """One long prompt (chunked at the budget), cached whole: every later prefix is cut from it."""
        room = min(self.max_len - 2, (self.pages - 1) * self.ps - 2)
        n = max(1, min(longest, room))
        self.base = self.tokens(n)
        chunks = -(-n // self.budget)
        self.phase(f"long prompt {n} tokens ({chunks} chunk{'s' * (chunks > 1)})",
                   [self.request(self.base, SamplingParams(temperature=0.0, ignore_eos=True), 1)], 0)

    def extend_probes(self) -> list[tuple[int, int]]:
        """(cached prefix c, new tokens q) pairs: each prefill tier's q at each width class of W (and of
        W - sink pages with a window); then T = 1 (a re-sent prompt) and T a multiple of 16 (the budget-sized
        chunk is the long prompt's, cache_base)."""
        ps, out = self.ps, set()
        bases = [0] + ([self.sink_pages] if self.window and self.sink_pages else [])
        for lo, rep in _TIERS:
            for base in bases:
                for cls in ("1", "16k", "other"):
                    q = min(rep, ps * (base + 1)) if cls == "1" else rep  # a one-page table holds few tokens
                    if q < lo or q > self.budget:
                        continue
                    w_min = -(-q // ps)
                    seen = _first_in_class(max(1, w_min - base), cls)  # the width a kernel reads
                    if seen is None:
                        continue
                    width = seen + base  # the step's table: W pages, the page attention's W - sink
                    c = (width * ps - q) // ps * ps  # so that c + q ends in page W
                    out.add((c, q))
        out.add((ps * max(1, -(-40 // ps)), 1))  # a re-sent prompt: one new token over a cached prefix
        for q in (48, 128):
            if q <= self.budget:
                out.add((0, q))
        return sorted(p for p in out if p[0] + p[1] + 2 <= self.max_len
                      and -(-(p[0] + p[1] + 2) // ps) < self.pages)

    def extend(self, c: int, q: int) -> None:
        if c > len(self.base):
            log.debug("warm-up: skipped extend c=%d q=%d (no cached prefix that long)", c, q)
            return
        prompt = self.base[:c] + self.tokens(q)
        width = -(-(c + q) // self.ps)
        self.phase(f"extend c={c} q={q} W={width}",
                   [self.request(prompt, SamplingParams(temperature=0.0, ignore_eos=True), 2)])

    def decode_probes(self, eager: bool = False) -> list[tuple[int, int]]:
        """(rows, context) of every decode batch to step: one per graph key (bucket, power-of-two splits) with
        CUDA graphs (unless `eager`), else one per eager signature of paged_decode (which a mixed step's leading
        decode rows run too); contexts end one token short of a page boundary, so the batch's steps keep its
        width."""
        runner, ps = self.core.runner, self.ps
        graphs, attn = (None if eager else runner.graphs), runner.attention
        buckets = graphs.buckets if graphs is not None else batch_buckets(self.max_rows)
        longest = min(self.max_len - 4, (self.pages - 2 - self.max_rows) * ps)
        contexts = [k * ps - 1 for k in range(1, longest // ps + 1) if k * ps - 1 >= 2] or [2]
        hkv, sms = runner.kv.num_kv_heads, dispatch.sm_count(runner.device)
        seen: dict[tuple, tuple[int, int]] = {}
        for rows in buckets:
            if not self.fits([2] * rows, 4):
                continue
            for ctx in contexts:
                splits = attn.decode_splits(rows, ctx)
                if graphs is not None:
                    key: tuple = ("graph", rows, _pow2(splits))
                else:
                    width = -(-ctx // ps)
                    key = ("eager", _width_class(splits), _pow2(splits), _width_class(width), _width_class(rows),
                           dispatch.fp8_wide_launch(rows * hkv, sms))  # FP8's register cap of a wide launch
                if key not in seen:
                    seen[key] = (rows, ctx)
        probes = sorted(seen.values())
        if len(probes) > _MAX_DECODE_PHASES:
            log.debug("warm-up: %d decode batches, stepping the first %d", len(probes), _MAX_DECODE_PHASES)
            probes = probes[:_MAX_DECODE_PHASES]
        return probes

    def decode(self, rows: int, ctx: int, params: Sequence[SamplingParams] | None = None, label: str = "") -> None:
        """A batch of `rows` decode rows: one on a cached prefix with `ctx` tokens at its first decode step,
        the others two-token prompts; row 0 greedy, the rest sampled (or `params`, cycled)."""
        if ctx - 1 > len(self.base):
            ctx = len(self.base) + 1
        if not self.fits([ctx] + [2] * (rows - 1), 4):
            log.debug("warm-up: skipped decode rows=%d ctx=%d (pool)", rows, ctx)
            return
        if params is None:
            params = [SamplingParams(temperature=0.0, ignore_eos=True), SamplingParams(temperature=0.8, ignore_eos=True)]
        prompts = [self.base[:max(1, ctx - 1)]] + [self.tokens(2) for _ in range(rows - 1)]
        reqs = [self.request(p, params[min(i, len(params) - 1)], 16) for i, p in enumerate(prompts)]
        self.phase(label or f"decode rows={rows} ctx={ctx}", reqs)

    def sampler_probes(self, covered: Sequence[int]) -> None:
        """Sampled batches of every S whose gumbel_argmax signature no decode batch had; then filtered
        rows, logprobs and penalties."""
        runner = self.core.runner
        sampled = SamplingParams(temperature=0.8, ignore_eos=True)
        if runner.device.type == "cuda":
            vocab, dev = runner.model.vocab_rows, runner.device
            have = {_gumbel_signature(s, vocab, dev) for s in covered}
            for s in range(1, self.max_rows + 1):
                sig = _gumbel_signature(s, vocab, dev)
                if sig not in have:
                    have.add(sig)
                    self.decode(s, 2, [sampled], f"sampled rows={s}")
        variants = {
            "top-k/top-p/min-p": SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, ignore_eos=True),
            "logprobs": SamplingParams(temperature=0.0, logprobs=5, ignore_eos=True),
            "penalties": SamplingParams(temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.5,
                                        presence_penalty=0.5, min_tokens=2, ignore_eos=True),
        }
        few = min(4, self.max_rows)
        for name, p in variants.items():
            self.decode(1, 2, [p], f"{name} rows=1")
            if few > 1:
                self.decode(few, 2, [p, sampled], f"{name} rows={few}")

    def mixed(self, rows: int, ctx: int, q: int) -> None:
        """`rows` decode rows running (one with `ctx` tokens of cached prefix, at least two) while a fresh
        prompt's chunk of `q` tokens is admitted: steps of both."""
        ctx = max(2, min(ctx, len(self.base) + 1))
        q = min(q, self.budget - rows, self.max_len - 2)
        if rows < 1 or q < 1 or not self.fits([ctx] + [2] * (rows - 1) + [q], 8):
            return
        p = SamplingParams(temperature=0.0, ignore_eos=True)
        prompts = [self.base[:ctx - 1] if ctx > 2 else self.tokens(2)] + [self.tokens(2) for _ in range(rows - 1)]
        reqs = [self.request(prompt, p, 16) for prompt in prompts]
        self.phase(f"mixed rows={rows} ctx={ctx} + chunk q={q}", reqs, 3,
                   then=lambda: [self.request(self.tokens(q), p, 2)])

    def cascade(self) -> None:
        """Rows sharing a cached prefix at the cascade rule's floor, one batch per cascade bucket from the
        floor's row count up; then two groups over one outer prefix (two levels)."""
        runner, cfg = self.core.runner, self.core.config
        floor = runner.cascade_rule.floor if cfg.scheduler.cascade else None
        if floor is None:
            return
        min_rows, min_tokens = floor
        shared = -(-max(min_tokens, 1) // self.ps) * self.ps
        if shared + 2 > len(self.base):
            return
        buckets = runner.graphs.cascade_buckets if runner.graphs is not None else batch_buckets(self.max_rows)
        p = SamplingParams(temperature=0.0, ignore_eos=True)
        for rows in (b for b in buckets if b >= max(2, min_rows)):
            if not self.fits([2] * rows, 4, shared):
                continue
            reqs = [self.request(self.base[:shared] + self.tokens(2), p, 16) for _ in range(rows)]
            self.phase(f"cascade rows={rows} shared={shared}", reqs)
        rows = max(2, min_rows)
        if 2 * rows > self.max_rows or not self.fits([2] * (2 * rows), 4, 3 * shared):
            return
        inner = [self.base[:shared] + self.tokens(shared) for _ in range(2)]
        for prefix in inner:  # cache each group's own continuation first
            self.phase("cascade inner prefix", [self.request(prefix, p, 1)], 0)
        reqs = [self.request(inner[g] + self.tokens(2), p, 16) for g in range(2) for _ in range(rows)]
        self.phase(f"cascade two levels 2x{rows} rows", reqs)


def _gumbel_signature(rows: int, vocab: int, device: torch.device) -> tuple:
    """What gumbel_argmax compiles for `rows` sampled rows of a `vocab`-wide logits row (kernels/sample.py's
    split rule): partial or not, the merge tile and the split count's class."""
    from radixkv.kernels.sample import (  # Triton: CUDA engines only
        GPU_CONFIG,
        default_splits,
    )

    block = GPU_CONFIG.block_n
    splits = default_splits(rows, vocab, block, device)
    chunk = math.ceil(math.ceil(vocab / splits) / block) * block
    splits = math.ceil(vocab / chunk)
    return splits > 1, _pow2(splits), _width_class(splits)
