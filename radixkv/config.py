"""Frozen, validated configuration dataclasses, and every dtype name and alias (one home). No torch.

Each component takes the config it needs; nothing reads module globals.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, fields, replace

from radixkv.plan_host import check_host_tier


class Policy(enum.Enum):
    """Order in which waiting requests are admitted."""

    FCFS = "fcfs"
    LPM = "lpm"  # longest cached prefix first
    DFS_WEIGHT = "dfs-weight"  # SGLang's: walk the tree, heavier subtrees first


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets and the admission policy.

    max_batch_tokens: new tokens computed per step (decode tokens + prefill chunks).
    max_running: requests in the running set at once (the replay's --concurrency).
    starvation_steps / starvation_s: a waiting request older than either bound is served next,
    whatever the policy (None disables that bound): each step the oldest starved request
    (equal arrivals in policy order) is offered a place before anyone else, and if it does not
    fit nobody is admitted that step; the other requests keep their policy order.
    policy_window: the policy orders only the oldest `policy_window` waiting requests each step.
    match_budget: tree matches an admission round may spend on ordering (bounds per-step work):
    LPM and DFS_WEIGHT keep each candidate's last match and re-match up to this many per round.
    in_batch_sharing: a waiting request whose first uncached block is being computed this step
    by another request waits one step and then hits it, instead of computing it twice.
    prefix_caching: False turns the prefix cache off (vLLM's enable_prefix_caching=False): no match,
    no insert, no in-batch sharing; every prompt is computed in full (the honest cache-off baseline).
    decode_reserve: share (0..1) of every running request's remaining output tokens whose pages
    admission keeps free (at least one page per decoding request); higher means fewer
    preemptions and fewer requests running at once.
    cascade: each Batch also carries its cascade levels (`Batch.cascade`: decode rows sharing cached
    pages, scheduler/cascade_groups.py), for the cascade decode kernels; False: Batch.cascade is None.
    (These are the replay's defaults; LLM(...) decides max_running and cascade itself when not given:
    EngineConfig.auto_max_num_seqs / auto_cascade.)
    """

    policy: Policy = Policy.LPM
    max_batch_tokens: int = 8192
    max_running: int = 256
    starvation_steps: int | None = 200
    starvation_s: float | None = 10.0
    policy_window: int = 4096
    match_budget: int = 128
    in_batch_sharing: bool = True
    prefix_caching: bool = True
    decode_reserve: float = 0.0
    cascade: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a Policy, got {self.policy!r}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.starvation_steps is not None and self.starvation_steps < 1:
            raise ValueError(f"starvation_steps must be >= 1 or None, got {self.starvation_steps}")
        if self.starvation_s is not None and self.starvation_s <= 0:
            raise ValueError(f"starvation_s must be > 0 or None, got {self.starvation_s}")
        if not 0.0 <= self.decode_reserve <= 1.0:
            raise ValueError(f"decode_reserve must lie in [0, 1], got {self.decode_reserve}")
        if self.match_budget < 1:
            raise ValueError(f"match_budget must be >= 1, got {self.match_budget}")
        if self.policy_window < 1:
            raise ValueError(f"policy_window must be >= 1, got {self.policy_window}")


DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                  "half": "float16"}


def canonical_dtype_name(dtype: object) -> str:
    """'auto' or a float dtype name ('float32', 'bfloat16', 'float16') from a name or torch.dtype."""
    name = str(dtype).removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected a torch float dtype or one of "
                         f"{DTYPES + tuple(DTYPE_ALIASES)}")
    return name


class KVDtype(enum.Enum):
    """Storage dtype of the KV pages (the value is the name used in configs and on the command line)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    INT4 = "int4"  # group-wise, packed two values a byte (radixkv/kernels/intq.py)
    INT2 = "int2"  # group-wise, packed four values a byte

    @property
    def is_fp8(self) -> bool:
        return self in (KVDtype.FP8_E4M3, KVDtype.FP8_E5M2)

    @property
    def is_int(self) -> bool:
        """Group-wise integer codes packed into uint8 pages, with (scale, zero) per group."""
        return self in (KVDtype.INT4, KVDtype.INT2)

    @property
    def bits(self) -> int:
        """Bits of one stored K or V value (scales not included)."""
        return _KV_BITS[self]

    @property
    def itemsize(self) -> int:
        """Bytes of one element of the page tensor (scales not included): for INT4/INT2 a uint8 byte,
        which holds 8 // bits values."""
        return max(1, self.bits // 8)

    @classmethod
    def parse(cls, name: object) -> "KVDtype":
        """A KVDtype from itself, its name, an alias or a torch.dtype ('auto' is the caller's to resolve)."""
        canonical = canonical_kv_dtype_name(name)
        if canonical == "auto":
            raise ValueError("kv_dtype 'auto' must be resolved to the compute dtype first")
        return cls(canonical)

    @classmethod
    def for_compute(cls, dtype_name: str) -> "KVDtype":
        """The KV dtype that `kv_dtype='auto'` means for a compute dtype name (DTYPES, not 'auto')."""
        return cls(KV_DTYPE_ALIASES[dtype_name])


_KV_BITS = {KVDtype.FP32: 32, KVDtype.BF16: 16, KVDtype.FP16: 16, KVDtype.FP8_E4M3: 8, KVDtype.FP8_E5M2: 8,
            KVDtype.INT4: 4, KVDtype.INT2: 2}
KV_DTYPES = ("auto", *(k.value for k in KVDtype))
# other spellings users bring from vLLM / torch ("fp8" is vLLM's name for E4M3)
KV_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
               "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
               "float8_e5m2": "fp8_e5m2"}


def canonical_kv_dtype_name(kv_dtype: object) -> str:
    """'auto' or a KVDtype value from a name, an alias, a KVDtype or a torch.dtype."""
    if isinstance(kv_dtype, KVDtype):
        return kv_dtype.value
    name = str(kv_dtype).removeprefix("torch.") if not isinstance(kv_dtype, str) else kv_dtype
    name = KV_DTYPE_ALIASES.get(name, name)
    if name not in KV_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; expected one of {KV_DTYPES} "
                         f"(or an alias: {', '.join(KV_DTYPE_ALIASES)})")
    return name


# INT2 pages are not offered to users (issue 34 item 2): decode over them ran at 0.46x bf16's speed on the H200
# (slower than bf16, FP8 and INT4 while storing two bits a value) and they triple SmolLM2's perplexity
# (benchmarks/RESULTS.md, "KV dtypes: which to use"). A dtype slower than bf16 is a trap; the kernels, the
# planner's arithmetic and the accuracy benchmark keep it, behind this opt-in, until its decode beats FP8's.
INT2_OPT_IN = "RADIXKV_ALLOW_INT2_KV"


def check_kv_dtype_offered(name: str) -> None:
    """ValueError for kv_dtype "int2" unless the environment sets RADIXKV_ALLOW_INT2_KV=1 (see INT2_OPT_IN)."""
    if name == KVDtype.INT2.value and os.environ.get(INT2_OPT_IN) != "1":
        raise ValueError("kv_dtype int2 is not offered: its decode is slower than bf16's on the H200 (0.46x) and it "
                         "triples perplexity; use int4 (+1% perplexity, 3.6x fewer bytes than bf16) or fp8_e4m3 "
                         f"(docs/kv-dtypes.md). Set {INT2_OPT_IN}=1 to run it anyway (accuracy studies, kernel work)")


# vLLM's names (LLM(...) keyword arguments) for radixkv's knobs of the same meaning
VLLM_NAMES = {"block_size": "page_size", "kv_cache_dtype": "kv_dtype", "num_gpu_blocks_override": "num_pages",
              "max_num_seqs": "max_running", "max_num_batched_tokens": "max_batch_tokens",
              "enable_prefix_caching": "prefix_caching"}

# how the weights are loaded (vLLM's load_format): "auto" reads the checkpoint; "dummy" builds seeded random
# weights shaped by the folder's config.json, keeping the folder's tokenizer and chat template (benchmarks)
LOAD_FORMATS = ("auto", "dummy")


def check_load_format(value: object) -> str:
    """`value` if it is one of LOAD_FORMATS, else ValueError naming it and the allowed ones."""
    if not isinstance(value, str) or value not in LOAD_FORMATS:
        raise ValueError(f"load_format {value!r} is not supported; expected one of {', '.join(LOAD_FORMATS)}")
    return value


# The per-step token budget when the user gives none (SchedulerConfig's own, 8192, stays the replay's), by
# vLLM's usage contexts (its OpenAI server and its LLM class default differently too):
# - serving (`radixkv serve`, AsyncLLM.start; usage="serve") and every non-CUDA device: the knee of the
#   measured latency/throughput curve (benchmarks/RESULTS.md, "Mixed steps"): 64 decode rows + a 2,048-token
#   chunk take 54 ms a step at 38k prefill tokens/s, the plateau; 8,192 stalls every decode row 227 ms a step.
# - offline on CUDA (LLM(...), usage="offline"): throughput, not inter-token latency: few-shot GSM8K (512 x
#   8-shot) 7.8 s at 8,192 against 9.5 s at 2,048 (82 mixed steps of 2,048 tokens, each carrying ~250 decode
#   rows, against 20 of 8,192), ShareGPT offline 19.6k against 19.1k output tok/s ("Defaults with graph memory
#   counted", 2026-12-02).
ENGINE_STEP_BUDGET = 2048
OFFLINE_STEP_BUDGET = 8192
USAGES = ("offline", "serve")


def engine_step_budget(device_type: str, usage: str) -> int:
    """The per-step token budget the engine takes when the user gives none (see OFFLINE_STEP_BUDGET)."""
    return OFFLINE_STEP_BUDGET if device_type == "cuda" and usage == "offline" else ENGINE_STEP_BUDGET


def budget_given(kwargs: dict[str, object]) -> bool:
    """Whether LLM(...)'s keyword arguments set the per-step token budget (max_batch_tokens, vLLM's
    max_num_batched_tokens, or a SchedulerConfig passed whole)."""
    return any(k in kwargs for k in ("max_batch_tokens", "max_num_batched_tokens", "scheduler"))


# LLM(...)'s running-set size when the user gives none (max_num_seqs, max_running or a scheduler): decided by the
# engine once its KV pool is sized (ModelRunner.__init__, engine_max_running). SchedulerConfig's own 256 stays
# the replay's and CPU's.
ENGINE_MAX_RUNNING_FLOOR = 256  # never fewer than the old default (SchedulerConfig.max_running)
# The rule's cap: the largest running set measured to pay (+28% on ShareGPT offline at 1,024 rows against 256).
# Its decode graphs write one shared logits buffer and their memory is reserved before the pool is sized
# (plan.graph_reserve_bytes): one output per graph once kept sum(buckets) x vocabulary floats alive, which ran
# an 8B engine with a 128k vocabulary out of memory at start-up (2026-12-02, H200).
ENGINE_MAX_RUNNING_CAP = 1024
ENGINE_POOL_TOKENS_PER_ROW = 512


def engine_max_running(pool_tokens: int, max_batch_tokens: int, device_type: str, kv_window: int | None) -> int:
    """The engine's max_num_seqs when the user gives none: on CUDA
    `max(256, min(ENGINE_MAX_RUNNING_CAP, max_batch_tokens, pool_tokens // 512))`; 256 on any other device (CPU
    tests keep their old running set) and with a recent-token window (`kv_window` > 0: INT4/INT2 pages by
    default), whose shadow pages are reserved for the rows that can run (plan.kv_pool_split, issue 34 item 4),
    so a bigger running set costs pool.

    Why (benchmarks/RESULTS.md, "Serving under load, cold start, mixed steps, defaults", H200, Llama-3-8B shape,
    bf16, vLLM's ShareGPT offline recipe: 1,000 requests, 85,661 prompt + 350,851 output tokens):
    max_num_seqs 256 gave 14,634 output tok/s, 1,024 gave 18,799 (+28%; FP8 KV at 1,024: 18,585). That pool
    held ~858k tokens (53,606 pages of 16), so it never limited 1,024 rows. 1,024 is the cap: the largest
    running set measured (more was not measured to pay, and each batch bucket is one more decode graph captured
    and warmed at start-up); SGLang likewise sizes its running set from memory. 512 pool tokens a row: a
    ShareGPT request is ~437 tokens (prompt + output) on average, so a running set of pool_tokens // 512 fits
    the pool at that length instead of trading the larger batch for preemptions; below 131,072 pool tokens
    (256 x 512) the old default stays (a 24 GB card under an 8B model). A decode row takes one token of the
    step budget, so the set never exceeds max_batch_tokens (ENGINE_STEP_BUDGET, 2,048, by default)."""
    if device_type != "cuda" or kv_window:
        return ENGINE_MAX_RUNNING_FLOOR
    rows = min(ENGINE_MAX_RUNNING_CAP, max_batch_tokens, pool_tokens // ENGINE_POOL_TOKENS_PER_ROW)
    return max(ENGINE_MAX_RUNNING_FLOOR, rows)


def engine_cascade(device_type: str, cascade_possible: bool = True) -> bool:
    """Whether the engine turns cascade decode on when the user does not say (cascade / scheduler not given):
    on CUDA, where the cascade kernels and graphs run and the scheduler's rule (scheduler/cascade_groups.py)
    decides each step whether a group is worth a cascade launch (none without shared pages: the group search
    stops at O(rows) when no two rows share a first page; measured 0.96-1.00 of plain steps without sharing,
    1.07-5.2x with it, few-shot 9.9x cache-off against 8.9x without). Off on CPU (the reference backend: no
    speed to gain) and when `cascade_possible` is False: the KV dtype's rule takes no group (INT4/INT2 pages or a
    recent-token window: RULE_NEVER), so no step pays the search, or attention runs on the PyTorch reference."""
    return device_type == "cuda" and cascade_possible


def max_running_given(kwargs: dict[str, object]) -> bool:
    """Whether LLM(...)'s keyword arguments set the running-set size (max_running, vLLM's max_num_seqs, or a
    SchedulerConfig passed whole)."""
    return any(k in kwargs for k in ("max_running", "max_num_seqs", "scheduler"))


def cascade_given(kwargs: dict[str, object]) -> bool:
    """Whether LLM(...)'s keyword arguments say whether cascade decode runs (cascade, or a SchedulerConfig)."""
    return any(k in kwargs for k in ("cascade", "scheduler"))


@dataclass(frozen=True)
class EngineConfig:
    """Everything LLM(...) needs besides the model.

    dtype: compute dtype name ('auto' = the checkpoint's, bf16 for an fp32 checkpoint on CUDA).
    kv_dtype: 'auto' = the compute dtype, else one of KV_DTYPES (aliases and torch dtypes accepted):
    fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, int4, int2.
    device: 'cpu', 'cuda', 'cuda:1', ... or None (CUDA when available).
    num_pages: KV pages; None sizes the pool from `gpu_memory_utilization` of the free device
    memory left after the weights (CUDA) or a fixed token budget (CPU).
    seed: random weights (model given as a config) and the default sampling stream.
    enforce_eager: never replay CUDA graphs (vLLM's name). max_model_len: prompt + output cap
    below the model's own context (None: the model's).
    async_scheduling (vLLM's name): overlap the host's scheduling of decode step N+1 with the device's
    work on step N (engine/llm.py); None: on when the model runs on a CUDA device.
    tensor_parallel_size: ranks the model is sharded over (engine/parallel.py): this process is rank 0
    and starts the others (gloo on CPU, NCCL on CUDA: one GPU a rank from `device` on).
    dist_timeout_s: how long a rank waits in a collective, or at start-up, before the engine reports the
    ranks it waits for as failed (TensorParallelError) instead of hanging.
    kv_window: each query reads its kv_window most recent keys in full precision and only older ones from
    quantised pages (KIVI's window; radixkv/engine/kv_window.py); None: plan.DEFAULT_KV_WINDOW (16) for
    int4 / int2 pages, none for the others; 0: none. No cascade steps with a window.
    kv_sink: with a window, every sequence's first kv_sink tokens (attention sinks; a multiple of
    page_size) are read in full precision too; None: plan.DEFAULT_KV_SINK (16) rounded up to whole pages
    for int4 / int2 pages with a window, none for the others.
    load_format (vLLM's name): "auto" reads the model's weights; "dummy" builds seeded random weights shaped by
    the model folder's config.json and keeps the folder's tokenizer and chat template (benchmarking a model
    without its weights). Anything else is refused naming the value.
    warmup: drive synthetic requests through every kernel specialisation and CUDA graph a served request can
    reach before the engine is returned (radixkv/engine/warmup.py); None: on when the model runs on CUDA
    (off on CPU, where Triton's interpreter makes it slow).
    auto_max_num_seqs: the user gave no running-set size (max_num_seqs / max_running / scheduler): the engine
    decides scheduler.max_running once its pool is sized (engine_max_running; ModelRunner.config holds the
    decided config). auto_cascade: the user did not say whether cascade decode runs (cascade / scheduler): the
    engine decides (engine_cascade). auto_budget: the user gave no per-step budget (max_num_batched_tokens /
    max_batch_tokens / scheduler): the engine decides it by device and `usage` (engine_step_budget).
    from_kwargs sets all three; an EngineConfig built directly keeps its scheduler's.
    usage: "offline" (LLM(...): throughput) or "serve" (`radixkv serve`, AsyncLLM.start: inter-token latency),
    vLLM's usage context; it only picks defaults (the per-step budget).
    host_kv_cache_bytes / hicache_ratio: a host-memory tier under the KV pool (issue 37, engine/host_kv.py), in
    bytes or as host pages per GPU page (SGLang's); None / 0: none. Checked by radixkv/plan_host.py.
    The per-step token budget (scheduler.max_batch_tokens, vLLM's max_num_batched_tokens) must hold one page;
    given explicitly with num_pages, it may not exceed the pool (num_pages * page_size tokens).
    """

    page_size: int = 16
    dtype: str = "auto"
    kv_dtype: str = "auto"
    device: str | None = None
    num_pages: int | None = None
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    enforce_eager: bool = False
    max_model_len: int | None = None
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    dist_timeout_s: float = 600.0
    kv_window: int | None = None
    kv_sink: int | None = None
    load_format: str = "auto"
    warmup: bool | None = None
    scheduler: SchedulerConfig = SchedulerConfig()
    auto_max_num_seqs: bool = False
    auto_cascade: bool = False
    auto_budget: bool = False
    usage: str = "offline"
    host_kv_cache_bytes: int | None = None
    hicache_ratio: float | None = None

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> "EngineConfig":
        """An EngineConfig from LLM(...)'s keyword arguments: its own field names, the
        SchedulerConfig fields, or vLLM's names for the same knobs (VLLM_NAMES). An unknown
        name raises TypeError naming it; a name given twice (under two spellings) too."""
        own = {f.name for f in fields(cls)}
        sched_names = {f.name for f in fields(SchedulerConfig)}
        mine: dict[str, object] = {}
        sched: dict[str, object] = {}
        for key, value in kwargs.items():
            name = VLLM_NAMES.get(key, key)
            target = mine if name in own else sched if name in sched_names else None
            if target is None:
                raise TypeError(f"LLM() got an unexpected keyword argument {key!r}")
            if name in target:
                raise TypeError(f"LLM() got {name!r} twice (as {key!r} too)")
            target[name] = value
        if not budget_given(kwargs):
            sched["max_batch_tokens"] = ENGINE_STEP_BUDGET
        for flag, given in (("auto_max_num_seqs", max_running_given), ("auto_cascade", cascade_given),
                            ("auto_budget", budget_given)):
            if flag in mine:
                raise TypeError(f"LLM() got an unexpected keyword argument {flag!r} (the engine sets it)")
            mine[flag] = not given(kwargs)
        if sched:
            base = mine.get("scheduler", SchedulerConfig())
            if not isinstance(base, SchedulerConfig):
                raise TypeError(f"scheduler must be a SchedulerConfig, got {base!r}")
            mine["scheduler"] = replace(base, **sched)
        cfg = cls(**mine)  # type: ignore[arg-type]
        if cfg.num_pages is not None and budget_given(kwargs):  # a default budget is simply capped by the pool
            cfg.check_budget_fits(cfg.num_pages)
        return cfg

    def with_engine_defaults(self, pool_tokens: int, device_type: str, kv_window: int | None,
                             cascade_possible: bool) -> EngineConfig:
        """This config with the defaults the engine decides once its pool is sized: scheduler.max_batch_tokens
        (engine_step_budget, raised no further than the pool holds) when auto_budget, scheduler.max_running
        (engine_max_running) when auto_max_num_seqs, scheduler.cascade (engine_cascade) when auto_cascade; itself
        when none. Depends only on its arguments (every tensor-parallel rank decides the same)."""
        sched = self.scheduler
        if self.auto_budget:  # before the running set, which never exceeds the budget
            budget = min(engine_step_budget(device_type, self.usage), pool_tokens)  # no more than the pool holds
            sched = replace(sched, max_batch_tokens=max(budget, sched.max_batch_tokens))
        if self.auto_max_num_seqs:
            sched = replace(sched, max_running=engine_max_running(pool_tokens, sched.max_batch_tokens, device_type,
                                                                  kv_window))
        if self.auto_cascade:
            sched = replace(sched, cascade=engine_cascade(device_type, cascade_possible))
        return self if sched == self.scheduler else replace(self, scheduler=sched)

    def check_budget_fits(self, num_pages: int) -> None:
        """ValueError naming the budget when scheduler.max_batch_tokens exceeds a pool of `num_pages` pages
        (no step could ever compute that many tokens). The engine calls it once the pool is sized, for a
        budget given explicitly."""
        budget, pool = self.scheduler.max_batch_tokens, num_pages * self.page_size
        if budget > pool:
            raise ValueError(f"max_batch_tokens (max_num_batched_tokens) {budget} is larger than the KV pool: "
                             f"{num_pages} pages x {self.page_size} tokens = {pool} tokens; give at most {pool}")

    def __post_init__(self) -> None:
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"max_model_len must be an int >= 1 or None, got {self.max_model_len!r}")
        object.__setattr__(self, "dtype", canonical_dtype_name(self.dtype))
        object.__setattr__(self, "kv_dtype", canonical_kv_dtype_name(self.kv_dtype))
        check_kv_dtype_offered(self.kv_dtype)
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1 or None, got {self.num_pages}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be True, False or None, got {self.async_scheduling!r}")
        if self.async_scheduling and self.tensor_parallel_size != 1:
            raise ValueError("async_scheduling=True is not supported with tensor_parallel_size > 1 yet "
                             "(the workers read each step's input ids from the host)")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise TypeError(f"scheduler must be a SchedulerConfig, got {self.scheduler!r}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp!r}")
        if self.kv_window is not None and (isinstance(self.kv_window, bool) or not isinstance(self.kv_window, int)
                                           or self.kv_window < 0):
            raise ValueError(f"kv_window must be an int >= 0 or None, got {self.kv_window!r}")
        if self.kv_sink is not None and (isinstance(self.kv_sink, bool) or not isinstance(self.kv_sink, int)
                                         or self.kv_sink < 0 or self.kv_sink % self.page_size):
            raise ValueError(f"kv_sink must be None or an int >= 0 and a multiple of page_size {self.page_size}, "
                             f"got {self.kv_sink!r}")
        if self.kv_sink and self.kv_window == 0:
            raise ValueError(f"kv_sink={self.kv_sink} needs a recent-token window: kv_window=0 turns it off")
        if not self.dist_timeout_s > 0:
            raise ValueError(f"dist_timeout_s must be > 0, got {self.dist_timeout_s!r}")
        check_load_format(self.load_format)
        if self.warmup is not None and not isinstance(self.warmup, bool):
            raise ValueError(f"warmup must be True, False or None, got {self.warmup!r}")
        check_host_tier(self.host_kv_cache_bytes, self.hicache_ratio)
        if self.usage not in USAGES:
            raise ValueError(f"usage must be one of {', '.join(USAGES)}, got {self.usage!r}")
        for flag in ("auto_max_num_seqs", "auto_cascade", "auto_budget"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        budget = self.scheduler.max_batch_tokens
        if budget < self.page_size:
            raise ValueError(f"max_batch_tokens (max_num_batched_tokens) {budget} is smaller than one page "
                             f"({self.page_size} tokens); give at least {self.page_size}")
