"""OutputProcessor: the engine core's per-step deltas -> text deltas, stop strings, RequestOutputs.

Both front ends apply it after `core.step()` (the core never calls it): the offline LLM to find stop
strings and build the final outputs, the server's API process to stream text. Per request it keeps a
TextStream, so a stop string is looked for once a step over the new text only.

TextStream: text is released in deltas that never split a multi-byte character (a decode ending in
the replacement character U+FFFD waits for the next token) and never show the beginning of a stop
string that may still complete: the last `len(longest stop) - 1` characters are held back until the
request finishes. When a stop string appears, the text ends before it (or after it, with
`include_stop_str_in_output`) and the front end ends the request in the core (`core.finish`). With
`min_tokens`, stop strings are looked for only once the output has that many tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixkv.prompt_logprobs import LogprobsBlock, PromptLogprobs
from radixkv.request import (CompletionOutput, FinishReason, Logprob, LogprobsDict, PositionLogprobs, Request,
                             RequestOutput)
from radixkv.sampling_params import SamplingParams

from .core import RequestDelta


@dataclass(eq=False)
class RequestState:
    """What the front end knows of one request: its tokens so far, text stream and how it ended."""

    request_id: str  # the front end's id (the server's "cmpl-...-0"; the offline LLM's str(rid))
    rid: int  # the core's id
    params: SamplingParams
    index: int  # which of its prompt's n completions
    prompt_ids: list[int]
    prompt_text: str | None
    text: TextStream | None  # None: no stop strings and nothing streamed (the text is decoded at the end)
    output: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None  # one per output token, when params.logprobs is set
    prompt_logprobs: LogprobsBlock | None = None  # every prompt token's after the first, once scored
    cached_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    unsent: str = ""  # text released by the stream and not yet taken by its consumer (take_text)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take_text(self) -> str:
        """The text released since the last call (a streaming consumer's delta)."""
        delta, self.unsent = self.unsent, ""
        return delta


class Update(NamedTuple):
    """One request's change in one step."""

    state: RequestState
    delta_text: str
    new_token_ids: list[int]
    finished: bool


class OutputProcessor:
    """Per-request detokenising and stop strings (see the module docstring).

    tokenizer: a transformers tokenizer, or None (outputs carry token ids only)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[int, RequestState] = {}  # by core rid, until the request finishes

    def add(self, req: Request, request_id: str | None = None, stream: bool = False) -> RequestState:
        """Track a request queued in the core. stream: text deltas every step (else the text is
        decoded once at the end, and only requests with stop strings are decoded as they go)."""
        s = req.sampling
        p = s.params
        text = (TextStream(self.tokenizer, p.stop, p.include_stop_str_in_output, p.skip_special_tokens,
                           p.min_tokens)
                if self.tokenizer is not None and (stream or p.stop) else None)
        state = RequestState(str(req.rid) if request_id is None else request_id, req.rid, p, s.index,
                             list(req.prompt), s.prompt_text, text,
                             logprobs=[] if p.logprobs is not None else None)
        self.states[req.rid] = state
        return state

    def process(self, deltas: Sequence[RequestDelta]) -> tuple[list[Update], list[int]]:
        """Apply one step's deltas. Returns the updates, and the rids whose text now holds a stop
        string: the front end ends those in the core (`core.finish`), they are finished here."""
        updates: list[Update] = []
        stopped: list[int] = []
        for d in deltas:
            state = self.states.get(d.rid)
            if state is None:  # finished here already (a stop string); the core ran it a step longer
                continue
            state.output.extend(d.new_token_ids)
            state.cached_tokens = d.cached_tokens
            if state.logprobs is not None and d.logprobs:
                state.logprobs.extend(d.logprobs)
            if d.prompt_logprobs is not None:
                state.prompt_logprobs = d.prompt_logprobs
            done = d.finish_reason is not None
            delta = ""
            if state.text is not None:
                delta = state.text.update(state.output, done)
                state.unsent += delta
                if state.text.stopped:
                    state.stop_reason = state.text.stop_str
                    if not done:
                        stopped.append(d.rid)
                    done, state.finish_reason = True, FinishReason.STOP.value
            if done:
                if state.finish_reason is None:
                    state.finish_reason = d.finish_reason
                    out, stops = state.output, state.params.stop_token_ids
                    if d.finish_reason == FinishReason.STOP.value and out and out[-1] in stops:
                        state.stop_reason = out[-1]
                del self.states[d.rid]
            updates.append(Update(state, delta, list(d.new_token_ids), done))
        return updates, stopped

    def end(self, rid: int, reason: FinishReason) -> RequestState | None:
        """Finish a request the front end ended itself (an abort); the state, or None if unknown."""
        state = self.states.pop(rid, None)
        if state is not None:
            state.finish_reason = reason.value
        return state

    def final_text(self, state: RequestState) -> str | None:
        """The whole text of a finished request: decoded at once, cut at the stop string that ended it."""
        if self.tokenizer is None:
            return None
        p = state.params
        text = self.tokenizer.decode(state.output, skip_special_tokens=p.skip_special_tokens)
        if isinstance(state.stop_reason, str):
            i, s = _find_stop(text, p.stop) or (len(text), state.stop_reason)
            text = text[: i + len(s)] if p.include_stop_str_in_output else text[:i]
        return text

    def completion(self, state: RequestState) -> CompletionOutput:
        """vLLM's CompletionOutput of one finished request."""
        lps = None if state.logprobs is None else [self.logprobs_dict(p) for p in state.logprobs]
        cum = None if state.logprobs is None else float(sum(p.logprob for p in state.logprobs))
        return CompletionOutput(state.index, self.final_text(state), list(state.output), state.finish_reason,
                                lps, state.stop_reason, cum)

    def request_output(self, states: Sequence[RequestState]) -> RequestOutput:
        """The RequestOutput of a prompt's n finished requests."""
        first = states[0]
        outs = [self.completion(s) for s in states]
        prompt_lps = None
        if first.params.prompt_logprobs is not None:
            prompt_lps = PromptLogprobs(first.prompt_logprobs, self.token_text)
        return RequestOutput(first.request_id, list(first.prompt_ids), outs[0].token_ids, outs[0].text,
                             first.cached_tokens, FinishReason(first.finish_reason), prompt=first.prompt_text,
                             outputs=outs, finished=True, prompt_logprobs=prompt_lps)

    def logprobs_dict(self, p: PositionLogprobs) -> LogprobsDict:
        """vLLM's {token id: Logprob} of one position: its token first, then the most likely ones."""
        out = {p.token: Logprob(p.logprob, p.rank, self.token_text(p.token))}
        for rank, (t, lp) in enumerate(zip(p.top_ids, p.top_logprobs), 1):
            if t not in out:
                out[t] = Logprob(lp, rank, self.token_text(t))
        return out

    def token_text(self, token: int) -> str | None:
        """One token's text (None without a tokenizer)."""
        return None if self.tokenizer is None else self.tokenizer.decode([token])


def _find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(position, string) of the earliest stop string in text, or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


class TextStream:
    """Turns a request's growing token list into text deltas.

    tokenizer: a transformers tokenizer, or None (a model without one streams token ids only).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), include_stop_str_in_output: bool = False,
                 skip_special_tokens: bool = True, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop_str_in_output
        self.skip_special = skip_special_tokens
        self.text = ""  # everything decoded so far (stop string cut applied once stopped)
        self.sent = 0  # characters of `text` already released
        self.stopped = False  # a stop string was found
        self.stop_str: str | None = None  # the one found
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._prefix = 0  # output tokens before the decode window
        self._read = 0  # output tokens whose text is in `text`

    def update(self, token_ids: Sequence[int], finished: bool) -> str:
        """The new text to release for the request's output `token_ids` (all of them so far).

        Decodes only a window: the tokens since the last release plus a few before them, so that
        tokenizers whose decode depends on the left context (SentencePiece's leading spaces) give
        the same text as decoding everything, at a cost independent of the output's length."""
        if self.tokenizer is None or self.stopped:
            return ""
        ids = list(token_ids[self._prefix:])
        if not ids:
            return self._release(finished)
        before = self._decode(ids[: self._read - self._prefix])
        text = self._decode(ids)
        if text.endswith("\ufffd") and not finished:
            return ""  # half a character: wait for the rest of its bytes
        new = text[len(before):]
        if not new and not finished:
            return ""
        searched_from = max(0, len(self.text) - self._hold)
        self.text += new
        self._prefix, self._read = self._read, len(token_ids)
        if self.stop and len(token_ids) >= self.min_tokens:
            hit = self._find_stop(searched_from)
            if hit is not None:
                self.text, self.stopped, finished = hit, True, True
        return self._release(finished)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special) if ids else ""

    def _release(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.sent, len(self.text) - self._hold)
        delta = self.text[self.sent:end]
        self.sent = end
        return delta

    def _find_stop(self, start: int) -> str | None:
        """The text up to (or through) the earliest stop string found at or after `start`."""
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.stop_str = s
        return self.text[: i + len(s)] if self.include_stop else self.text[:i]
