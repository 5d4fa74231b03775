"""HostKV: the host tier's bytes (issue 37): pinned host pages mirroring a KVStore's pages, and the copies
that demote GPU pages to them (device-to-host) and promote them back (host-to-device).

The radix tree moves bookkeeping only (cache/tree_host.py); it calls this object (its HostMover) with page
id pairs: `demote(gpu_pages, host_pages)` before the GPU pages go back to the pool, `promote(host_pages,
gpu_pages)` before the promoted blocks enter the GPU tier (a promoted block keeps its host page, so its next
demotion asks for no copy). A call validates its ids and adds them to a
batch; batches are queued on the device when 256 MiB of copies wait, and at `fence()`. The engine calls
`fence()` before every step it launches (EngineCore), so an admission's demotions and loads (one tree call
per node) move as a few large transfers, and no step runs before the copies it depends on are queued.
Copies of the same page keep the order they were asked in (a new batch starts where a page repeats or the
direction changes).

- On CUDA the batches run on two streams of their own: the copy stream gathers / scatters GPU pages
  (device memory) and the link stream moves staging buffers over the link. Each flush first makes the
  copy stream wait for the compute stream's work queued so far (steps in flight may still write the
  source pages, or a page just freed); then, piece by piece (page-sized or larger), a demotion is
  gathered into one of two staging buffers on the copy stream and copied to host on the link stream,
  a load copied in on the link stream and scattered on the copy stream. The two buffers alternate, so
  the gather of one piece overlaps the link copy of the one before (each buffer's reuse waits for its
  last user). An event is recorded on the copy stream behind its last gather / scatter; `fence()` makes
  the compute stream wait on it (no host sync; no wait when nothing was flushed since the last fence):
  no step reads a promoted page before its bytes landed and no step writes a demoted page before it was
  gathered (a demotion's link copy reads the staging buffer, so steps need not wait for it). Order per
  page holds: every GPU-page access is on the copy stream, every host-page access on the link stream,
  each in the order asked (a GPU page demoted then reused by a promotion in the same admission; a host
  page freed by one copy and reused by the next).
- On CPU (tests) the "device" pages are CPU tensors and a flush copies them at once; with
  `delay_copies=True` nothing is flushed before `fence()` (a test seam: `pending_gpu_pages` names the
  pages whose copies are not queued yet, and a step that read one would see the wrong bytes).

Host layout: page-first by default, `[num_host_pages, page_bytes]` uint8 where one host page is every
layer's K and V (and FP8 scales or INT (scale, zero) pairs) of one GPU page back to back. A run of
consecutive host pages is then one contiguous host range, so a transfer of n pages is one copy per run
(>= one whole page, 2 MiB for Llama-3-8B bf16 at page 16) instead of one per run per layer tensor
(2 x layers x runs copies of 32 KiB). `layout="layer"` keeps one `[num_host_pages, chunk]` region per
layer tensor (the GPU's layout) for comparison; benchmarks/engine/host_tier_gpu.py measures both.
The GPU side is layer-first (KVStore), so each transfer gathers (or scatters) the pages of every layer
tensor through a contiguous device staging buffer, at device-memory speed.

Failure: an exception from `demote` / `promote` (bad ids, or an injected fault in tests) propagates to the
tree, which drops the block (demotion) or recomputes it (promotion); nothing here holds pages. A CUDA error
in a flushed copy is asynchronous and, as any CUDA error, fatal to the engine's device context.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from radixkv.config import EngineConfig
from radixkv.plan_host import HOST_STAGING_BYTES, check_pinnable, host_pages

from .kv_store import KVStore
from .kv_window import KVWindow

if TYPE_CHECKING:
    from .runner import ModelRunner

LAYOUTS = ("page", "layer")
_STAGING_BYTES = HOST_STAGING_BYTES  # device staging per transfer piece (a transfer of more pages is cut)
_FLUSH_BYTES = 256 << 20  # copies asked for are queued on the device once this many are waiting (or at a fence)


def page_views(kv: KVStore) -> list[Tensor]:
    """Every per-layer tensor of the store (K, V, then their scales) as uint8 [P, bytes of one page], views
    of the same memory (FP8 / INT pages and scales are head-major: their [P, Hkv, S, ...] order is the
    contiguous one)."""
    out = []
    for t in [*kv.k_cache, *kv.v_cache, *kv.k_scale, *kv.v_scale]:
        c = t if t.is_contiguous() else t.transpose(1, 2)
        if not c.is_contiguous():
            raise ValueError(f"host tier: a KV tensor of shape {tuple(t.shape)} and strides {t.stride()} "
                             "has no contiguous page layout")
        out.append(c.reshape(c.shape[0], -1).view(torch.uint8))
    return out


def pinned_bytes(nbytes: int) -> Tensor:
    """uint8 [nbytes] of page-locked host memory, exactly nbytes: pageable memory registered with CUDA
    (cudaHostRegister; unregistered when the tensor is freed). PyTorch's pinned allocator
    (`pin_memory=True`) would round the request up to a power of two (a 48 GiB tier would pin 64); it is
    the fallback where registering fails."""
    t = torch.empty(nbytes, dtype=torch.uint8)
    try:
        rt = torch.cuda.cudart()
        err = rt.cudaHostRegister(t.data_ptr(), nbytes, 0)
    except (AttributeError, RuntimeError):
        err = -1
    if int(getattr(err, "value", err)) != 0:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    weakref.finalize(t, rt.cudaHostUnregister, t.data_ptr())
    return t


class _Batch:
    """Copies of one direction asked for in a row: GPU pages paired with host pages (each page at most once)."""

    def __init__(self, to_host: bool) -> None:
        self.to_host = to_host
        self.gpu: set[int] = set()
        self.host: set[int] = set()
        self._g: list[int] = []
        self._h: list[int] = []

    def add(self, g: list[int], h: list[int]) -> None:
        self._g += g
        self._h += h
        self.gpu.update(g)
        self.host.update(h)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gpu, host) int64 ids, sorted by host page (consecutive host pages form runs: one copy each)."""
        g, h = np.asarray(self._g, dtype=np.int64), np.asarray(self._h, dtype=np.int64)
        order = np.argsort(h, kind="stable")
        return g[order], h[order]


def _runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(first index into ids, first id, length) of each run of consecutive ids (ids sorted)."""
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(ids)]))
    return [(int(s), int(ids[s]), int(e - s)) for s, e in zip(starts, ends)]


class HostKV:
    """Pinned host pages for a KVStore (see the module docstring); the tree's HostMover."""

    def __init__(self, kv: KVStore, num_host_pages: int, layout: str = "page", *, delay_copies: bool = False,
                 pin: bool | None = None, window: KVWindow | None = None) -> None:
        """window: the runner's recent-token window over `kv`, if any: a promotion unmaps the pages it writes
        (KVWindow.forget), whose full-precision shadows would otherwise be of their old content."""
        if layout not in LAYOUTS:
            raise ValueError(f"host tier layout must be one of {LAYOUTS}, got {layout!r}")
        if isinstance(num_host_pages, bool) or not isinstance(num_host_pages, int) or num_host_pages < 1:
            raise ValueError(f"host tier: num_host_pages must be an int >= 1, got {num_host_pages!r}")
        self.kv, self.layout, self.num_pages, self.window = kv, layout, num_host_pages, window
        self.device = kv.device
        self._views = page_views(kv)
        self._chunks = [v.shape[1] for v in self._views]
        self.page_bytes = sum(self._chunks)
        cuda = self.device.type == "cuda"
        pin = cuda if pin is None else pin
        # one allocation: [num_host_pages, page_bytes] (page) or the tensors' regions back to back (layer)
        self._flat = pinned_bytes(num_host_pages * self.page_bytes) if pin else torch.empty(
            num_host_pages * self.page_bytes, dtype=torch.uint8)
        self._host: list[Tensor] = []  # per layer tensor: [num_host_pages, chunk] (strided in "page")
        off = 0
        pages = self._flat.view(num_host_pages, self.page_bytes)
        for c in self._chunks:
            self._host.append(pages[:, off: off + c] if layout == "page"
                              else self._flat[num_host_pages * off: num_host_pages * (off + c)].view(num_host_pages, c))
            off += c
        self._pages = pages  # page layout's [num_host_pages, page_bytes]
        self.delay_copies = delay_copies and not cuda
        self.flush_pages = max(1, _FLUSH_BYTES // self.page_bytes)  # a batch this large is queued at once
        self._batches: list[_Batch] = []  # copies asked for and not queued on the device yet, in order
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._event = torch.cuda.Event() if cuda else None
        # page layout on CUDA: the link stream and two staging buffers (allocated at the first flush) with the
        # event each buffer's last user recorded; layer layout: per-piece staging on the copy stream alone
        self._link = torch.cuda.Stream(self.device) if cuda and layout == "page" else None
        self._staging: list[Tensor] = []
        self._free = [torch.cuda.Event(), torch.cuda.Event()] if self._link is not None else []
        self._turn = 0
        self._unfenced = False  # copies queued since the compute stream last waited for them
        self.bytes_d2h = self.bytes_h2d = 0
        self.pages_d2h = self.pages_h2d = 0

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    @property
    def pending_gpu_pages(self) -> set[int]:
        """GPU pages whose copy has been asked for but not queued on the device yet (fence queues them)."""
        out: set[int] = set()
        for b in self._batches:
            out |= b.gpu
        return out

    # ---- the tree's HostMover ------------------------------------------------------------------
    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        """Copy GPU pages gpu_pages[i] to host pages host_pages[i] (queued; see the module docstring)."""
        self._add(True, gpu_pages, host_pages)
        self.pages_d2h += len(gpu_pages)
        self.bytes_d2h += len(gpu_pages) * self.page_bytes

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None:
        """Copy host pages host_pages[i] to GPU pages gpu_pages[i] (queued; see the module docstring)."""
        self._add(False, gpu_pages, host_pages)
        if self.window is not None:
            self.window.forget(list(map(int, gpu_pages)))  # (on the compute stream: before a later step maps them)
        self.pages_h2d += len(gpu_pages)
        self.bytes_h2d += len(gpu_pages) * self.page_bytes

    def fence(self) -> None:
        """Queue every copy asked for, and order everything the caller queues next on the compute stream
        after them (CUDA: a stream wait on the copies' event, no host sync; CPU: the copies run now)."""
        self._flush()
        if self._unfenced and self._stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self._event)
        self._unfenced = False

    def synchronize(self) -> None:
        """Wait on the host until every copy asked for finished (benchmarks, tests)."""
        self.fence()
        for stream in (self._stream, self._link):
            if stream is not None:
                stream.synchronize()

    # ---- batching ------------------------------------------------------------------------------
    def _add(self, to_host: bool, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        """Validate one call's pages and add them to the batch of its direction at the end of the list
        (a new batch when the last one goes the other way or already names one of the pages: copies of
        the same page stay in the order they were asked for). Raises, adding nothing, on bad ids."""
        g = np.asarray(gpu_pages, dtype=np.int64)
        h = np.asarray(host_pages, dtype=np.int64)
        if g.shape != h.shape or g.ndim != 1:
            raise ValueError(f"host tier: {g.shape} GPU pages for {h.shape} host pages")
        if len(h) and (h.min() < 0 or h.max() >= self.num_pages):
            raise ValueError(f"host tier: host page ids must be in [0, {self.num_pages}), got {h.tolist()}")
        if len(g) and (g.min() < 0 or g.max() >= self._views[0].shape[0]):
            raise ValueError(f"host tier: GPU page ids must be in [0, {self._views[0].shape[0]}), got {g.tolist()}")
        gl, hl = g.tolist(), h.tolist()
        last = self._batches[-1] if self._batches else None
        if (last is None or last.to_host != to_host or not last.gpu.isdisjoint(gl)
                or not last.host.isdisjoint(hl)):
            last = _Batch(to_host)
            self._batches.append(last)
        last.add(gl, hl)
        if not self.delay_copies and sum(len(b.gpu) for b in self._batches) >= self.flush_pages:
            self._flush()  # big enough to move now (overlapping the host's work until the fence)

    def _flush(self) -> None:
        """Queue the batches asked for, oldest first (CUDA: on the copy stream, after the compute stream's
        work so far, which may still write these pages; CPU: run now)."""
        if not self._batches:
            return
        if self._stream is None:
            while self._batches:
                self._transfer(*self._batches[0].arrays(), to_host=self._batches[0].to_host)
                self._batches.pop(0)
            return
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):
            self._stream.wait_stream(compute)
            try:
                while self._batches:
                    # a batch leaves the list once queued: one that raises midway (no device memory for the
                    # staging) stays, with those after it, and the next fence queues it again (a copy queued
                    # twice copies the same bytes: nothing ran between), so no step runs on pages it missed
                    self._transfer(*self._batches[0].arrays(), to_host=self._batches[0].to_host)
                    self._batches.pop(0)
            finally:
                self._event.record(self._stream)
                self._unfenced = True

    def _transfer(self, g: np.ndarray, h: np.ndarray, to_host: bool) -> None:
        """Copy pages g <-> host pages h (h sorted), in pieces of at most _STAGING_BYTES of staging (two
        buffers of half that each, pipelined, with the link stream)."""
        pipelined = self._link is not None
        step = max(1, (_STAGING_BYTES // 2 if pipelined else _STAGING_BYTES) // self.page_bytes)
        for i in range(0, len(g), step):
            (self._piece_pipelined if pipelined else self._piece)(g[i: i + step], h[i: i + step], to_host)

    def _piece_pipelined(self, g: np.ndarray, h: np.ndarray, to_host: bool) -> None:
        """One piece through staging buffer `_turn` (page layout, CUDA; called on the copy stream): gather then
        link copy (demotion), or link copy then scatter (load). The buffer's previous user finished first."""
        dev, n, link, copy = self.device, len(g), self._link, self._stream
        if not self._staging:
            rows = max(1, _STAGING_BYTES // 2 // self.page_bytes)
            self._staging = [torch.empty(rows, self.page_bytes, dtype=torch.uint8, device=dev) for _ in range(2)]
            for buf in self._staging:
                buf.record_stream(link)  # freed (with this object) only after the link's copies out of it
        staging, free = self._staging[self._turn][:n], self._free[self._turn]  # [n, page_bytes]
        self._turn ^= 1
        gi = torch.from_numpy(g).to(dev, non_blocking=True)  # [n] int64
        runs = _runs(h)
        if to_host:
            copy.wait_event(free)
            self._gather(staging, gi)
            link.wait_stream(copy)
            with torch.cuda.stream(link):
                self._over_link(staging, runs, to_host, True)
                free.record(link)
            return
        link.wait_event(free)
        with torch.cuda.stream(link):
            self._over_link(staging, runs, to_host, True)
        copy.wait_stream(link)
        self._scatter(staging, gi)
        free.record(copy)

    def _piece(self, g: np.ndarray, h: np.ndarray, to_host: bool) -> None:
        dev, n = self.device, len(g)
        gi = torch.from_numpy(g).to(dev, non_blocking=True)  # [n] int64
        runs = _runs(h)
        nb = dev.type == "cuda"
        if self.layout == "page":
            staging = torch.empty(n, self.page_bytes, dtype=torch.uint8, device=dev)  # [n, page_bytes]
            if to_host:
                self._gather(staging, gi)
            self._over_link(staging, runs, to_host, nb)
            if not to_host:
                self._scatter(staging, gi)
            return
        for v, host in zip(self._views, self._host):  # layer-first: one staging [n, chunk] per tensor
            if to_host:
                staging = v.index_select(0, gi)
                for r, first, length in runs:
                    host[first: first + length].copy_(staging[r: r + length], non_blocking=nb)
            else:
                staging = torch.empty(n, v.shape[1], dtype=torch.uint8, device=dev)
                for r, first, length in runs:
                    staging[r: r + length].copy_(host[first: first + length], non_blocking=nb)
                v.index_copy_(0, gi, staging)


    def _gather(self, staging: Tensor, gi: Tensor) -> None:
        """Pages gi [n] of every layer tensor into staging [n, page_bytes], each page's chunks back to back."""
        off = 0
        for v, c in zip(self._views, self._chunks):
            staging[:, off: off + c] = v.index_select(0, gi)
            off += c

    def _scatter(self, staging: Tensor, gi: Tensor) -> None:
        """_gather's inverse: staging [n, page_bytes] into pages gi [n] of every layer tensor."""
        off = 0
        for v, c in zip(self._views, self._chunks):
            v.index_copy_(0, gi, staging[:, off: off + c])
            off += c

    def _over_link(self, staging: Tensor, runs: list[tuple[int, int, int]], to_host: bool, nb: bool) -> None:
        """Staging rows <-> host pages (page layout), one copy per run of consecutive host pages."""
        for r, first, length in runs:
            if to_host:
                self._pages[first: first + length].copy_(staging[r: r + length], non_blocking=nb)
            else:
                staging[r: r + length].copy_(self._pages[first: first + length], non_blocking=nb)


def build_host_kv(runner: ModelRunner, cfg: EngineConfig) -> HostKV | None:
    """The host tier cfg asks for over runner's KV store (EngineConfig.host_kv_cache_bytes or hicache_ratio),
    or None. Refused, naming the value, when it holds no page, when the machine cannot pin it (MemAvailable),
    under tensor parallelism (each rank's shard would need its own copies: not built yet) and without prefix
    caching (nothing to keep)."""
    b, r = cfg.host_kv_cache_bytes, cfg.hicache_ratio
    if not b and r is None:
        return None
    what = f"host_kv_cache_bytes={b}" if r is None else f"hicache_ratio={r}"
    if cfg.tensor_parallel_size > 1:
        raise ValueError(f"{what}: the host KV tier does not run with tensor_parallel_size="
                         f"{cfg.tensor_parallel_size} yet (give one or the other)")
    if not cfg.scheduler.prefix_caching:
        raise ValueError(f"{what}: the host KV tier needs prefix caching (enable_prefix_caching=False given)")
    page_bytes = sum(v.shape[1] for v in page_views(runner.kv))
    n = host_pages(runner.num_pages, page_bytes, b, r)
    if n < 1:
        raise ValueError(f"{what} holds no KV page (one page is {page_bytes} bytes)")
    check_pinnable(b if r is None else n * page_bytes, what)
    return HostKV(runner.kv, n, window=runner.attention.window)


__all__ = ["HostKV", "LAYOUTS", "build_host_kv", "page_views"]
