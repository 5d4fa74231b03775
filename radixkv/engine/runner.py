"""ModelRunner: one rank's model, KV store, recent-token window, attention, CUDA graphs and sampler.

It turns a Batch into sampled tokens: `launch(batch)` queues the forward pass, the sampler and the
copy of the tokens to a pinned host buffer; `collect(launched)` waits for them. It knows nothing of
the scheduler, the radix tree or any request's text. With tensor parallelism, rank 0's runner starts
the worker ranks (tp_workers.py), each of which builds a runner of its own and runs `forward_local`
over its shard every step; only rank 0 samples.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.config import EngineConfig, KVDtype
from radixkv.plan import kv_sink_for, kv_window_for
from radixkv.prompt_logprobs import LogprobsBlock
from radixkv.request import PositionLogprobs
from radixkv.scheduler.cascade_groups import RULE_NEVER, CascadeRule, rule_for

from .attention import Backend, PagedAttention
from .cuda_graphs import DecodeGraphs
from .piecewise_graphs import MixedGraphs
from .device import host_to_device, pick_device
from .inputs import ModelLimits
from .kv_store import KVStore, default_num_pages
from .kv_window import KVWindow
from .size_checks import check_sizes
from .model import LlamaModel
from .parallel import TPGroup
from .grammar import Grammars
from .logprobs import prompt_logprobs, token_logprobs
from .sampling import penalize, sample, sampling_rows
from .tp_workers import TensorParallel
from .weights import LoadedModel, load_model

log = logging.getLogger(__name__)


class Launched(NamedTuple):
    """A step whose forward and sampler are queued on the device; its tokens not read yet."""

    batch: Batch
    rows: list[int]  # [S] the batch rows that sample, in the sampler's order
    drawn: Tensor  # int64 [S] sampled tokens, on the device
    host: Tensor | None  # int64 [S] pinned copy of drawn, valid once `ready` has fired (CUDA); None on CPU
    ready: torch.cuda.Event | None
    logprobs: dict[int, PositionLogprobs]  # by row, for sampling rows that asked for them
    # by row, for rows scoring prompt tokens: (the position of the first, their scores)
    prompt_logprobs: dict[int, tuple[int, LogprobsBlock]]


class Forwarded(NamedTuple):
    """A step whose forward pass is queued and whose sampler is not (ModelRunner.forward, then .sample)."""

    batch: Batch
    logits: Tensor  # [S, V] float32, the sampling rows' (a CUDA graph's output: sample before the next forward)
    prompt_logprobs: dict[int, tuple[int, LogprobsBlock]]  # as Launched's


class PromptScoring(NamedTuple):
    """The prompt positions a step scores (SamplingParams.prompt_logprobs): the logits at position i
    give the log-probability of prompt token i + 1, so a row's positions stop before its prompt's last."""

    index: list[int]  # [N] indices into the step's tokens
    targets: list[int]  # [N] the prompt token each predicts
    spans: dict[int, tuple[int, int, int, int]]  # row -> (first position, first entry, entries, top k)

    @classmethod
    def of(cls, batch: Batch) -> PromptScoring | None:
        index: list[int] = []
        targets: list[int] = []
        spans: dict[int, tuple[int, int, int, int]] = {}
        for b, r in enumerate(batch.requests):
            k = r.sampling.params.prompt_logprobs if r.sampling is not None else None
            if k is None:  # the common case: a decode step checks one attribute a row
                continue
            start = batch.seq_lens[b] - batch.q_lens[b]
            end = min(batch.seq_lens[b], len(r.prompt) - 1)
            if end <= start:
                continue
            spans[b] = (start, len(index), end - start, k)
            index.extend(range(batch.q_start[b], batch.q_start[b] + end - start))
            targets.extend(int(t) for t in r.prompt[start + 1: end + 1])
        return cls(index, targets, spans) if index else None


class ModelRunner:
    """One rank's share of the engine's device work (see the module docstring).

    Built from a loaded model (`load`): the pool's size (`num_pages`) is decided here, from the
    memory the weights leave, and agreed over the tensor-parallel ranks; then the defaults the user left to the
    engine (max_num_seqs from the pool, cascade on CUDA: EngineConfig.with_engine_defaults). `config` is the
    decided EngineConfig: build the EngineCore from it, not from the one passed in.
    """

    def __init__(self, loaded: LoadedModel, cfg: EngineConfig, device: torch.device,
                 attention_backend: Backend = Backend.AUTO, tp: TensorParallel | None = None,
                 tp_group: TPGroup | None = None) -> None:
        self.config, self.device, self.tp = cfg, device, tp
        self.spec, self.dtype = loaded.spec, loaded.dtype
        triton = attention_backend is Backend.TRITON or (attention_backend is Backend.AUTO and device.type == "cuda")
        group = tp.group if tp is not None else tp_group
        check_sizes(cfg, loaded.spec, loaded.dtype, device, group.world if group is not None else 1)  # before any allocation
        self.model = LlamaModel(loaded.spec, loaded.state_dict, loaded.dtype, device, fused=triton, tp=group)
        # token ids must index the embedding (a config may claim more rows than the checkpoint holds)
        self.vocab_size = min(self.spec.vocab_size, self.model.embed.shape[0], self.model.vocab_rows)
        self.kv_dtype = (KVDtype.for_compute(str(self.dtype).removeprefix("torch.")) if cfg.kv_dtype == "auto"
                         else KVDtype(cfg.kv_dtype))
        s = self.model.shard_spec  # this rank's heads (all of them without tensor parallelism)
        # KIVI's recent-token window (INT pages by default): shadow pages for every running row's latest tokens
        self.kv_window = kv_window_for(self.kv_dtype, cfg.kv_window)
        # the KV dtype's rule says when a cascade group is worth it (INT4/INT2 or a window: never)
        self.cascade_rule: CascadeRule = RULE_NEVER if self.kv_window else rule_for(self.kv_dtype, s.head_dim)
        # what the user left to the engine (max_num_seqs, cascade, the step budget: config.py), decided now the pool
        # is sized; this config is what everything below, the EngineCore's scheduler and the warm-up read
        cascade_pays = triton and self.cascade_rule is not RULE_NEVER  # (the reference backend gains nothing)
        num_pages, decided = self._size_pool(cfg, s, device, group, cascade_pays)
        self.config = cfg = decided
        self.num_pages = num_pages
        use_graphs = triton and device.type == "cuda" and not cfg.enforce_eager
        # with CUDA graphs one more page, never in the pool, takes the padding rows' K/V
        self.kv = KVStore(s.num_layers, num_pages + use_graphs, cfg.page_size, s.num_kv_heads, s.head_dim,
                          self.kv_dtype, device, self.dtype)
        self.kv_sink = kv_sink_for(self.kv_dtype, self.kv_window, cfg.page_size, cfg.kv_sink)
        window = (KVWindow(self.kv, self.kv_window, cfg.scheduler.max_running, self.kv_sink) if self.kv_window
                  else None)
        self.attention = PagedAttention(self.kv, s.num_q_heads, s.head_dim, s.head_dim ** -0.5, attention_backend,
                                        window=window)
        # extends' fp16 copies of FP8 / INT4 pages live during attention, when the step reserve's MLP share
        # (plan.step_reserve_bytes: [T, 2I] gate/up and [T, I] act of max_batch_tokens) is not in use
        self.attention.widen_max_bytes = 3 * cfg.scheduler.max_batch_tokens * s.intermediate_size * self.dtype.itemsize
        self.graphs = (DecodeGraphs(self.model, self.attention, cfg.scheduler.max_running,
                                    -(-self.limits.max_model_len // cfg.page_size), scratch_page=num_pages,
                                    cascade=cfg.scheduler.cascade and self.cascade_rule is not RULE_NEVER)
                       if use_graphs else None)
        if self.graphs is not None:
            self.graphs.capture_all()
            floor = self.cascade_rule.floor if cfg.scheduler.cascade else None
            if floor is not None:  # cascade graphs too, so a workload's cascade steps neither compile nor capture
                self.graphs.warm_cascade(*floor)
        # steps with prompt chunks: piecewise graphs (attention eager between them), one token bucket at a time
        self.mixed_graphs = (MixedGraphs(self.model, self.attention, cfg.scheduler.max_batch_tokens, num_pages)
                             if use_graphs and window is None and group is None else None)
        if self.mixed_graphs is not None:
            self.mixed_graphs.capture_all()
        if device.type == "cuda":  # two pinned token buffers, alternate steps (one may still be filling)
            rows = cfg.scheduler.max_running
            self._token_hosts = [torch.zeros(rows, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self._token_events = [torch.cuda.Event(), torch.cuda.Event()]
            self._token_turn = 0
        if group is not None:  # the first step's collectives wait only dist_timeout_s: every rank is built first
            group.barrier()

    def _size_pool(self, cfg: EngineConfig, spec: Any, device: torch.device, group: TPGroup | None,
                   cascade_pays: bool) -> tuple[int, EngineConfig]:
        """The KV pool's pages (cfg.num_pages, or default_num_pages) and cfg with the engine's defaults decided
        on that pool; with a recent-token window, the running set no larger than the rows whose shadow pages
        the pool holds (plan.kv_pool_split). The same on every tensor-parallel rank (the smallest pool)."""
        def size(c: EngineConfig) -> tuple[int, int]:
            if c.num_pages is not None:
                return c.num_pages, c.scheduler.max_running
            pages, rows = default_num_pages(spec, c, self.kv_dtype, self.dtype, device)
            return (pages, rows) if group is None else (group.min_over_ranks(pages), group.min_over_ranks(rows))

        num_pages, rows = size(cfg)
        decided = cfg.with_engine_defaults(num_pages * cfg.page_size, device.type, self.kv_window, cascade_pays)
        if cfg.num_pages is None and (decided.scheduler.max_running > cfg.scheduler.max_running
                                      or decided.scheduler.max_batch_tokens > cfg.scheduler.max_batch_tokens):
            # more rows sample a step, or more tokens: size the pool again with their activations and logits
            # reserved (a slightly smaller pool, on which the rules give at most as much, so the reserve covers it)
            num_pages, rows = size(decided)
            decided = cfg.with_engine_defaults(num_pages * cfg.page_size, device.type, self.kv_window, cascade_pays)
        if rows < decided.scheduler.max_running:
            say = log.info if cfg.auto_max_num_seqs else log.warning  # a value the user gave is cut: say it louder
            say("max_num_seqs %d -> %d: the recent-token window's shadow pages fit that many rows beside their KV "
                "at %s tokens a row (plan.kv_pool_split)", decided.scheduler.max_running, rows,
                cfg.max_model_len or "512")
            decided = replace(decided, scheduler=replace(decided.scheduler, max_running=rows))
        return num_pages, decided

    @classmethod
    def load(cls, model: Any, cfg: EngineConfig, attention_backend: Backend = Backend.AUTO,
             tp_group: TPGroup | None = None) -> tuple[ModelRunner, LoadedModel]:
        """Load `model` (weights.load_model's sources) and build its runner; with tensor_parallel_size > 1
        (and no tp_group: this is rank 0) start the worker ranks first. Returns the runner and what was
        loaded (its tokenizer and EOS ids are the front end's; the weights now live in the runner)."""
        device = pick_device(cfg.device)
        loaded = load_model(model, cfg.dtype, device, cfg.seed)
        tp = (TensorParallel.launch(cls, model, dict(cfg=cfg, attention_backend=attention_backend), loaded.spec,
                                    cfg.tensor_parallel_size, device, cfg.dist_timeout_s)
              if cfg.tensor_parallel_size > 1 and tp_group is None else None)
        try:
            runner = cls(loaded, cfg, device, attention_backend, tp, tp_group)
        except BaseException:
            if tp is not None:  # the workers would wait out the start-up timeout in the build's barrier
                tp.close()
            raise
        return runner, loaded._replace(state_dict={})

    @property
    def limits(self) -> ModelLimits:
        """What validating a request needs to know of this engine (torch-free)."""
        cap, ctx = self.config.max_model_len, self.spec.max_position
        return ModelLimits(vocab_size=self.vocab_size, max_model_len=ctx if cap is None else min(cap, ctx),
                           sliding_window=self.spec.sliding_window, page_size=self.config.page_size,
                           num_pages=self.num_pages, prompt_logprobs=self.tp is None and self.model.tp is None)

    @property
    def dead(self) -> bool:
        """True once nothing more can run here (the tensor-parallel ranks were shut down after a failure)."""
        return self.tp is not None and self.tp.failed

    def close(self) -> None:
        """Stop the tensor-parallel worker ranks, if any (idempotent)."""
        if self.tp is not None:
            self.tp.close()

    # ------------------------------------------------------------------ forward

    def forward_logits(self, batch: Batch, use_graphs: bool = True, input_ids: Tensor | None = None) -> Tensor:
        """Logits [S, V] float32 of the batch's sampling rows: from a CUDA graph when the step fits
        one (and use_graphs), else eagerly. Stores the step's K/V either way (on every rank). input_ids:
        int64 [K] on the device in place of batch.input_ids[:K] (a step scheduled ahead: its rows that follow
        the previous step; not with tensor parallelism, whose workers read the batch's host ids: async
        scheduling is off there)."""
        if self.tp is not None:  # tensor parallel: the workers run the same forward over their shards
            if input_ids is not None:
                raise RuntimeError("a step scheduled ahead cannot run tensor parallel (its ids are on rank 0's device)")
            return self.tp.run_step(batch, use_graphs, self.forward_local)
        return self.forward_local(batch, use_graphs, input_ids)

    def forward_local(self, batch: Batch, use_graphs: bool = True, input_ids: Tensor | None = None) -> Tensor:
        """forward_logits on this process's shard only (a tensor-parallel worker runs this each step)."""
        if use_graphs and self.graphs is not None and self.graphs.fits(batch):
            return self.graphs.run(batch, input_ids)  # every decode row samples
        if use_graphs and self.mixed_graphs is not None and self.mixed_graphs.fits(batch):
            return self.mixed_graphs.run(batch, input_ids)
        dev = self.device
        self.attention.plan(batch)
        last = [batch.q_start[b] + batch.q_lens[b] - 1 for b, s in enumerate(batch.sample) if s]
        return self.model.forward(self._input_ids(batch, input_ids), host_to_device(batch.positions, torch.int64, dev),
                                  self.attention, host_to_device(last, torch.int64, dev))

    def _input_ids(self, batch: Batch, head: Tensor | None) -> Tensor:
        """int64 [T] on the device: batch.input_ids with its first K replaced by head [K] (forward_logits)."""
        if head is not None and head.shape[0] == batch.num_tokens:
            return head
        ids = host_to_device(batch.input_ids, torch.int64, self.device)
        if head is not None:
            ids[:head.shape[0]] = head
        return ids

    # ------------------------------------------------------------------ sampling

    def launch(self, batch: Batch, prev: Launched | None = None,
               grammar_mask: tuple[Tensor, list[int]] | None = None) -> Launched:
        """Queue the forward pass and the sampler of `batch` (one token per sampling row) and the copy
        of the tokens to the host; read the logprobs of the rows that asked for them. prev: the step
        `batch` was scheduled ahead of (its tokens are batch's inputs). grammar_mask: the structured-output
        mask of the sampling rows (EngineCore's, Grammars.bitmask). Changes no request."""
        return self.sample(self.forward(batch, prev), grammar_mask)

    def forward(self, batch: Batch, prev: Launched | None = None) -> Forwarded:
        """Queue `batch`'s forward pass only (launch's first half): `sample` queues its sampler later, once
        the host knows what the sampler reads (a step scheduled ahead of rows that read their latest tokens:
        EngineCore). prev as for launch."""
        ids = None
        if batch.follows:  # the leading rows' inputs: prev's tokens, on the device
            ids = (prev.drawn if batch.follows == list(range(prev.drawn.shape[0]))
                   else prev.drawn.index_select(0, host_to_device(batch.follows, torch.int64, self.device)))
        scoring = PromptScoring.of(batch)
        prompt_lps: dict[int, tuple[int, LogprobsBlock]] = {}
        if scoring is None:
            logits = self.forward_logits(batch, input_ids=ids)
        else:
            logits = self._forward_scoring(batch, scoring, prompt_lps, ids)
        return Forwarded(batch, logits, prompt_lps)

    def sample(self, fw: Forwarded, grammar_mask: tuple[Tensor, list[int]] | None = None) -> Launched:
        """Queue the sampler of a forwarded step (launch's second half) over its requests as they are now
        (penalties read each row's output, the grammar mask its matcher's state). Use before the next
        step's forward (a CUDA graph's logits live until then). Changes no request."""
        batch, dev = fw.batch, self.device
        rows = [b for b, s in enumerate(batch.sample) if s]
        raw = logits = fw.logits
        prompt_lps = fw.prompt_logprobs
        reqs = [batch.requests[b] for b in rows]
        params = [r.sampling.params for r in reqs]
        if any(p.penalized or p.min_tokens for p in params):
            logits = penalize(logits, params, [r.prompt for r in reqs], [r.output for r in reqs],
                              [r.stop_token_ids for r in reqs])
        if grammar_mask is not None:  # structured outputs: tokens the grammar forbids at -inf (Grammars.bitmask)
            if logits is raw:
                logits = logits.clone()  # logprobs read the raw distribution
            Grammars.apply(logits, *grammar_mask)
        if all(p.greedy for p in params):
            drawn = logits.argmax(dim=-1)
        else:
            # the index in its request's output of the token each row draws (one past the host's
            # output for a step scheduled ahead)
            counters = [batch.seq_lens[b] - len(r.prompt) for b, r in zip(rows, reqs)]
            drawn = sample(logits, sampling_rows(params, [r.sampling.seed for r in reqs], counters,
                                                 logits.shape[1], dev))
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: dict[int, PositionLogprobs] = {}
        if want:
            idx = torch.tensor(want, dtype=torch.int64, device=dev)
            lps = token_logprobs(raw.index_select(0, idx), drawn.index_select(0, idx),
                                 [params[i].logprobs for i in want])
            logprobs = {rows[i]: lp for i, lp in zip(want, lps)}
        host = ready = None
        if dev.type == "cuda":
            turn = self._token_turn
            self._token_turn ^= 1
            if len(rows) > self._token_hosts[turn].numel():
                self._token_hosts[turn] = torch.zeros(len(rows), dtype=torch.int64, pin_memory=True)
            host, ready = self._token_hosts[turn][:len(rows)], self._token_events[turn]
            host.copy_(drawn, non_blocking=True)
            ready.record()
        return Launched(batch, rows, drawn, host, ready, logprobs, prompt_lps)

    def _forward_scoring(self, batch: Batch, scoring: PromptScoring, out: dict[int, tuple[int, LogprobsBlock]],
                         input_ids: Tensor | None = None) -> Tensor:
        """forward_logits (eager) that also scores the step's prompt positions into `out` (by row); input_ids as
        forward_logits'. Not under tensor parallelism (InputProcessor refuses prompt_logprobs there)."""
        if self.tp is not None or self.model.tp is not None:
            raise RuntimeError("prompt logprobs cannot be computed under tensor parallelism")
        dev = self.device
        self.attention.plan(batch)
        h = self.model.hidden(self._input_ids(batch, input_ids),
                              host_to_device(batch.positions, torch.int64, dev), self.attention)  # [T, H]
        last = [batch.q_start[b] + batch.q_lens[b] - 1 for b, s in enumerate(batch.sample) if s]
        logits = self.model.logits(h[host_to_device(last, torch.int64, dev)])  # [S, V]
        block = prompt_logprobs(self.model.logits, h[host_to_device(scoring.index, torch.int64, dev)],
                                scoring.targets, max(k for *_, k in scoring.spans.values()), logits.shape[1])
        for b, (pos, first, n, k) in scoring.spans.items():
            out[b] = (pos, block if len(scoring.spans) == 1 and k == block.k else block.slice(first, first + n, k))
        return logits

    def collect(self, launched: Launched) -> list[int | None]:
        """The launched step's tokens by row (None for rows that do not sample): waits for them."""
        if launched.ready is not None:
            launched.ready.synchronize()
            drawn = launched.host.tolist()
        else:
            drawn = launched.drawn.tolist()
        tokens: list[int | None] = [None] * len(launched.batch.requests)
        for b, t in zip(launched.rows, drawn):
            tokens[b] = t
        return tokens

