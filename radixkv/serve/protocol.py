"""OpenAI request bodies (pydantic, validated) and the OpenAI error object.

Fields follow the OpenAI API, plus vLLM's extras where radixkv has the concept (`top_k`, `min_p`,
`ignore_eos`, `stop_token_ids`, `min_tokens`, `repetition_penalty`, `cache_salt`, `chat_template`,
`return_token_ids`, `logit_bias`, `allowed_token_ids`, `bad_words`, ...); presence/frequency
penalties and logprobs (completions: `logprobs: k`; chat: `logprobs: true` + `top_logprobs: k`) as
OpenAI has them.

The field policy (docs/serving.md has the table): every field of vLLM's CompletionRequest and
ChatCompletionRequest is honoured (declared below), accepted because it cannot change the output
(ACCEPTED), or refused with HTTP 400 naming it (REFUSED) unless it holds its neutral value (null,
an empty list, or vLLM's default), which changes nothing. A field in neither vLLM model is refused
by name too: radixkv never answers 200 to a request it did not honour.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TokenIds = list[int]


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorInfo


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: int | str | None = None) -> dict[str, Any]:
    return ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code)).model_dump()


# vLLM fields that cannot change the generated output -> why (accepted, dropped)
ACCEPTED: dict[str, str] = {
    "user": "an end-user id for the client's own records",
    "request_id": "vLLM's id for its logs; radixkv names every response itself",
    "session_id": "a routing hint across requests",
    "length_penalty": "used by beam search only (use_beam_search is refused)",
    "include_reasoning": "used with a reasoning parser only (radixkv has none; vLLM without one ignores it too)",
    "stream_interval": "how many tokens a streamed chunk batches; the text is the same",
    "return_token_offsets": "vLLM reads it on its /render endpoints only",
    "return_mm_kwargs": "vLLM reads it on its /render endpoints only",
    "routed_experts_prompt_start": "routed-expert data, which radixkv never returns (no MoE models)",
}

# vLLM fields radixkv does not implement -> (their neutral values, why): 400 naming the field otherwise
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((False,), "beam search is not implemented"),
    "logprob_token_ids": ((), "logprobs of chosen token ids are not implemented"),
    "truncation_side": (("left",), "truncating the prompt's end is not implemented (its start is cut: 'left')"),
    "spaces_between_special_tokens": ((True,), "detokenising without spaces between special tokens "
                                               "is not implemented"),
    "watermarking": ((False,), "watermarking is not implemented"),
    "prompt_embeds": ((), "prompt embeddings are not supported"),
    "structural_tag": ((), "structural tags are not implemented (json, regex, choice and grammar are)"),
    "guided_whitespace_pattern": ((), "a whitespace pattern is not implemented (JSON is generated compact)"),
    "priority": ((0,), "priority scheduling is not implemented (vLLM refuses it too without it)"),
    "logits_processors": ((), "custom logits processors are not supported"),
    "return_tokens_as_token_ids": ((False,), "token-id names in logprobs are not implemented"),
    "return_prompt_text": ((False,), "returning the rendered prompt is not implemented"),
    "kv_transfer_params": ((), "disaggregated serving is not implemented"),
    "ec_transfer_params": ((), "disaggregated serving is not implemented"),
    "vllm_xargs": ((), "vLLM's extension arguments are not supported"),
    "repetition_detection": ((), "repetition detection is not implemented"),
    "thinking_token_budget": ((-1,), "thinking budgets are not implemented"),
    "mm_processor_kwargs": ((), "radixkv serves text-only models"),
    "media_io_kwargs": ((), "radixkv serves text-only models"),
}


# Size limits checked before any work (docs/serving.md): a text prompt, or a chat request's messages
# together, of more than PROMPT_CHARS_PER_TOKEN x max_model_len characters (a token-id prompt: that many
# ids), and a rendered chat prompt longer than that, are refused with 400 before they are tokenised.
PROMPT_CHARS_PER_TOKEN = 16


def prompt_bound(max_model_len: int) -> int:
    """The most characters (or token ids) a prompt may hold before it is refused unread."""
    return PROMPT_CHARS_PER_TOKEN * max_model_len


# chat_template_kwargs keys refused by name: apply_chat_template's own parameters (radixkv sets them), and the
# request fields the template is handed or that the field policy decides (send those as fields, where it applies)
TEMPLATE_PARAMETERS = frozenset({
    "conversation", "messages", "chat_template", "add_generation_prompt", "continue_final_message", "tokenize",
    "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})
TEMPLATE_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "documents", "reasoning_effort"})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    """UnsupportedField naming `chat_template_kwargs` (and the key) for a key that would set an
    apply_chat_template parameter or bypass the field policy (tools, documents, ...)."""
    for key in kwargs or {}:
        if key in TEMPLATE_PARAMETERS:
            raise UnsupportedField("chat_template_kwargs", f"chat_template_kwargs may not set {key!r}: it is a "
                                   "parameter of the chat template's rendering, which the request's own fields set")
        if key in TEMPLATE_FIELDS or key in REFUSED:
            raise UnsupportedField("chat_template_kwargs", f"chat_template_kwargs may not set {key!r}: send it as "
                                   "the request's own field, where the field policy applies")


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in text (not valid Unicode: no tokenizer can encode it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    if value is None or (isinstance(value, (list, dict)) and not value):
        return True
    return any(type(value) is type(n) and value == n for n in neutral)


def _check_extra(data: Any, declared: dict[str, Any]) -> Any:
    """Drop ACCEPTED fields; 400 (UnsupportedField) for a REFUSED one off its neutral value or an unknown one."""
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        if key in declared:
            out[key] = value
        elif key in ACCEPTED:
            continue
        elif key in REFUSED:
            neutral, why = REFUSED[key]
            if not _neutral(value, neutral):
                raise UnsupportedField(key, f"{key} is not supported by radixkv: {why}")
        else:
            raise UnsupportedField(key, f"unknown field {key!r}: it is not a field of this endpoint "
                                        f"(OpenAI's or vLLM's), so radixkv cannot honour it")
    return out


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")  # extras are sorted by _policy first

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    user: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=512)
    return_token_ids: bool = False
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0)
    min_tokens: int | None = Field(None, ge=0)
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    add_special_tokens: bool | None = None  # default: completions True, chat False (vLLM's)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's default cap (--max-logprobs 20)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # structured outputs (serve/structured_fields.py maps every spelling to one StructuredOutputsParams)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    # refused unless neutral (radixkv does not implement them)
    best_of: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return _check_extra(data, cls.model_fields)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v < -1:
            raise ValueError("top_k must be 0 or -1 (off) or >= 1")
        return None if v in (0, -1) else v

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("truncate_prompt_tokens must be >= 1, or -1 (the context's length)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k, b in (v or {}).items():
            if not k.strip().isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {k!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {b!r} for token {k}")
        return v

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(t < 0 for t in v)):
            raise ValueError("allowed_token_ids must be a non-empty list of token ids (ints >= 0)")
        return v

    @field_validator("bad_words")
    @classmethod
    def _bad_words(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not w.strip() for w in v):
            raise ValueError("bad_words must hold non-blank strings")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> "_Common":
        if self.best_of is not None and self.best_of != self.n:
            raise UnsupportedField("best_of", "best_of must equal n (radixkv returns every sample)")
        if self.stream and self.prompt_logprobs is not None:
            raise UnsupportedField("prompt_logprobs", "prompt_logprobs are not available with stream true "
                                                      "(as in vLLM); use echo with logprobs to stream them")
        return self

    @property
    def scored_prompt(self) -> int | None:
        """SamplingParams.prompt_logprobs: top alternatives per prompt token (None: the prompt is not scored)."""
        return self.prompt_logprobs

    @property
    def sampling_logprobs(self) -> int | None:
        """SamplingParams.logprobs: how many top alternatives per token (None: no logprobs)."""
        return None

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class UnsupportedField(ValueError):
    """A field radixkv accepts only at its neutral value; carries the field's name."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class CompletionRequest(_Common):
    """POST /v1/completions. prompt: text, token ids, or a list of either (one choice set each)."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(16, ge=0)  # 0 with echo: the prompt alone (and its logprobs)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's default cap (--max-logprobs 20)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("a token-id prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _completion_unsupported(self) -> "CompletionRequest":
        if self.suffix:
            raise UnsupportedField("suffix", "suffix is not supported by radixkv")
        if self.max_tokens == 0 and not self.echo:
            raise UnsupportedField("max_tokens", "max_tokens 0 returns nothing without echo; send echo true "
                                                 "to get the prompt (and its logprobs) alone")
        return self

    @property
    def sampling_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def scored_prompt(self) -> int | None:
        """Echo with logprobs scores the echoed prompt too (OpenAI's legacy completions, lm-eval)."""
        ks = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(ks) if ks else None

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(t, int) for t in p):
            return [list(p)]
        return list(p)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: handed to the template
    role: str = Field(min_length=1)
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    @model_validator(mode="after")
    def _valid_unicode(self) -> "ChatMessage":
        for name, value in (("role", self.role), ("content", self.text()), *(
                (k, v) for k, v in (self.model_extra or {}).items() if isinstance(v, str))):
            at = lone_surrogate(value)
            if at is not None:
                raise UnsupportedField("messages", f"messages: a message's {name} holds a lone surrogate "
                                                   f"(U+{ord(value[at]):04X} at {at}), which is not valid Unicode")
        return self


class ChatCompletionRequest(_Common):
    """POST /v1/chat/completions; the prompt is the tokenizer's chat template (or `chat_template`)
    over `messages`. max_tokens (or max_completion_tokens) defaults to the rest of the context."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's default cap (--max-logprobs 20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None  # none, auto (default with tools), required, a named function
    parallel_tool_calls: bool = True
    echo: bool = False
    documents: list[dict[str, str]] | None = None
    reasoning_effort: str | None = None

    @model_validator(mode="after")
    def _chat_unsupported(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise UnsupportedField("top_logprobs", "top_logprobs needs logprobs true")
        if self.continue_final_message and self.add_generation_prompt:
            raise UnsupportedField("continue_final_message",
                                   "continue_final_message needs add_generation_prompt false")
        check_template_kwargs(self.chat_template_kwargs)
        return self

    @property
    def sampling_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them: set fields only, content as text."""
    out = []
    for m in messages:
        d = {k: v for k, v in m.model_dump().items() if v is not None}
        d["content"] = m.text()
        out.append(d)
    return out
