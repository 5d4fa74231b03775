"""OpenAI request bodies (pydantic, validated) and the OpenAI error object.

Fields follow the OpenAI API, plus vLLM's extras where radixkv has the concept (`top_k`, `min_p`,
`ignore_eos`, `stop_token_ids`, `min_tokens`, `repetition_penalty`, `cache_salt`, `chat_template`,
`return_token_ids`, ...); presence/frequency penalties and logprobs (completions: `logprobs: k`;
chat: `logprobs: true` + `top_logprobs: k`) as OpenAI has them. Unknown fields are ignored, as
vLLM does, so clients that send more still work; fields that would change the output in a way
radixkv cannot honour (`logit_bias`, `suffix`, tools) are refused with HTTP 400 naming the field
rather than silently ignored.
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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

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
    # refused unless neutral (radixkv does not implement them)
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> "_Common":
        if self.logit_bias:
            raise UnsupportedField("logit_bias", "logit_bias is not supported by radixkv")
        if self.best_of is not None and self.best_of != self.n:
            raise UnsupportedField("best_of", "best_of must equal n (radixkv returns every sample)")
        return self

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
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
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
        return self

    @property
    def sampling_logprobs(self) -> int | None:
        return self.logprobs

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
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _chat_unsupported(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise UnsupportedField("top_logprobs", "top_logprobs needs logprobs true")
        if self.tools:
            raise UnsupportedField("tools", "tool calling is not supported by radixkv")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise UnsupportedField("response_format", "only response_format {'type': 'text'} is supported")
        if self.continue_final_message and self.add_generation_prompt:
            raise UnsupportedField("continue_final_message",
                                   "continue_final_message needs add_generation_prompt false")
        return self

    @property
    def sampling_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            d = {k: v for k, v in m.model_dump().items() if v is not None}
            d["content"] = m.text()
            out.append(d)
        return out
