"""A request's tokens, status and page ownership, and the result handed back. No torch.

Lifetime: WAITING -> RUNNING -> FINISHED; preemption sends RUNNING back to WAITING
(pages released, generated tokens kept, recomputed on re-admission).
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixkv.sampling_params import RequestSampling


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # max_tokens generated
    STOP = "stop"  # a stop token (EOS unless ignore_eos) was generated
    ABORT = "abort"  # withdrawn before it finished (Scheduler.abort)


@dataclass(eq=False)
class Request:
    """One generation request.

    prompt: token ids (non-empty): a list[int], or a 1-D int32 numpy array for long replayed
    traces (the scheduler hands it to the radix tree without conversion). output: generated ids.
    num_computed: leading tokens of prompt + output whose K/V sit in `pages`.
    cached_tokens: prompt tokens served from the prefix cache at first admission.
    pages: physical pages this request holds a reference on, one per block of its computed tokens.
    sampling: the sampler's per-request state (params, seed); the scheduler never reads it.
    read_cache: False when no cached prefix may be used (prompt logprobs need every prompt position's
    logits, so such a request computes its whole prompt; its blocks are still cached for others).
    """

    rid: int
    prompt: list[int]
    max_tokens: int
    arrival_s: float = 0.0
    namespace: str | None = None
    stop_token_ids: frozenset[int] = frozenset()
    sampling: RequestSampling | None = None
    read_cache: bool = True
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    num_computed: int = 0
    cached_tokens: int = 0
    pages: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.prompt) == 0:
            raise ValueError(f"request {self.rid}: empty prompt")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.rid}: max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def tokens(self) -> list[int]:
        """Prompt followed by the generated tokens, as a list."""
        prompt = self.prompt if isinstance(self.prompt, list) else list(map(int, self.prompt))
        return prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(self, token: int) -> bool:
        """Record one generated token; returns True when the request is now finished."""
        assert self.status is Status.RUNNING, f"request {self.rid} appended to while {self.status}"
        self.output.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = FinishReason.STOP
        elif len(self.output) >= self.max_tokens:
            self.finish_reason = FinishReason.LENGTH
        return self.finish_reason is not None


@dataclass(frozen=True)
class PositionLogprobs:
    """Log-probabilities at one position, as the engine core computes them (log_softmax of the
    model's raw logits): the token at it (sampled, or the prompt's next token), its log-probability
    and rank (1: the most likely), and the k most likely tokens with theirs, best first."""

    token: int
    logprob: float
    rank: int
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Logprob:
    """vLLM's: one token's log-probability, its rank (1: the most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


LogprobsDict = dict[int, Logprob]  # token id -> Logprob: one position's (vLLM's SampleLogprobs entry)


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt (vLLM's shape). index: which of the prompt's `n` completions.

    token_ids: generated ids (a stop token that ended it included; a stop string's tokens kept).
    text: the detokenised output (a stop string cut off unless include_stop_str_in_output; None
    when the model has no tokenizer). finish_reason: "stop", "length" or "abort".
    stop_reason: the stop string or stop token id that ended it (None for EOS, length, abort).
    logprobs: with SamplingParams.logprobs=k, one dict per generated token mapping token id ->
    Logprob (the sampled token and the k most likely ones), else None.
    """

    index: int
    text: str | None
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[LogprobsDict] | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    """Result of one prompt, in vLLM's shape plus radixkv's flat fields.

    vLLM's: request_id (str), prompt (text, or None for a token-id prompt), prompt_token_ids,
    outputs (one CompletionOutput per completion: SamplingParams.n of them), num_cached_tokens,
    finished. radixkv's (the first completion's): token_ids, text, cached_tokens (prompt tokens
    served from the prefix cache instead of being computed), finish_reason (a FinishReason, a str).
    prompt_logprobs: with SamplingParams.prompt_logprobs=k, one entry per prompt token: None for the
    first (nothing predicts it), then {token id: Logprob} of the prompt's token and the k most likely.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None  # None when the model has no tokenizer
    cached_tokens: int
    finish_reason: FinishReason
    prompt: str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    prompt_logprobs: Sequence[LogprobsDict | None] | None = None  # a PromptLogprobs: dicts built when read

    @property
    def num_cached_tokens(self) -> int:
        return self.cached_tokens
