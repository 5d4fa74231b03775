"""Grammars: structured outputs compiled to token masks (xgrammar, vLLM's and SGLang's default backend).

`compile(so)` turns a StructuredOutputsParams into an xgrammar CompiledGrammar, cached per spec
(JSON compact, no free whitespace between tokens, as vLLM's `disable_any_whitespace`: a model given free
whitespace can emit it until max_tokens instead of the next value)
(the front end compiles once to validate a request; the engine core's lookups then hit the cache);
a bad schema, regex or grammar is a ValueError naming the field and xgrammar's reason.
The core keeps one GrammarMatcher per constrained request (`start`, `accept`, `drop`): before a step
`bitmask(rids)` fills one packed row of allowed tokens per constrained sampling row ([S, ceil(V / 32)]
int32, a bit a token), and `apply(logits, mask, rows)` sets every token the grammar forbids to -inf,
one vectorised op on the logits' device. Rows without a grammar pay nothing.
A request whose grammar has terminated (it accepted a stop token) ends (`accept` returns True).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from radixkv.structured_outputs import StructuredOutputsParams

INSTALL = "pip install xgrammar"
CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped)


# xgrammar (0.2.9) lets a string with maxLength / minLength take raw control characters (U+0000-U+001F), which
# JSON forbids unescaped (mlc-ai/xgrammar#800): its length-bounded character rule lacks the \0-\x1f its plain
# strings exclude. json_grammar adds them back to that rule's class in the schema's grammar text.
_LOOSE_CHARACTER = '[^\\"\\\\\\r\\n]'
_JSON_CHARACTER = '[^\\0-\\x1f\\"\\\\\\r\\n]'


def json_grammar(schema: str) -> Any:
    """xgrammar's compact-JSON grammar of `schema` (any_whitespace=False), its strings never taking a raw control
    character (see _LOOSE_CHARACTER)."""
    xgr = _xgrammar()
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False)
    text = str(grammar)
    return grammar if _LOOSE_CHARACTER not in text else xgr.Grammar.from_ebnf(
        text.replace(_LOOSE_CHARACTER, _JSON_CHARACTER))


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ValueError(f"structured outputs need xgrammar: {INSTALL}") from None
    return xgrammar


class Grammars:
    """Compiled grammars and the matchers of constrained requests (module docstring).

    tokenizer: the model's transformers tokenizer (None: structured outputs are refused);
    vocab_size: the logits' width (a checkpoint may pad its vocabulary past the tokenizer's)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()  # the server compiles in worker threads
        self._matchers: dict[int, Any] = {}

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            if self.tokenizer is None:
                raise ValueError("structured outputs need a tokenizer; this model has none")
            xgr = _xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def compile(self, so: StructuredOutputsParams) -> Any:
        """The compiled grammar of `so` (cached); ValueError naming structured_outputs.<kind> when it is bad."""
        key = so.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            compiler = self._get_compiler()
            kind, spec = key
            try:
                if kind in ("json", "json_object"):  # compact JSON (module docstring)
                    compiled = compiler.compile_grammar(json_grammar(spec if kind == "json" else '{"type": "object"}'))
                elif kind == "regex":
                    compiled = compiler.compile_regex(spec)
                elif kind == "choice":
                    compiled = compiler.compile_regex("|".join(_regex_literal(c) for c in so.choice or ()))
                else:
                    compiled = compiler.compile_grammar(spec)
            except Exception as err:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with the reason
                reason = " ".join(str(err).split())[:500]
                raise ValueError(f"structured_outputs.{kind} does not compile: {reason}") from None
            self._cache[key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled

    # ---- the core's side: one matcher per constrained request
    def start(self, rid: int, so: StructuredOutputsParams, output: list[int]) -> None:
        """A matcher for request rid, advanced over its output so far (a request re-added after preemption
        keeps its tokens)."""
        matcher = _xgrammar().GrammarMatcher(self.compile(so))
        for t in output:
            matcher.accept_token(t)
        self._matchers[rid] = matcher

    def has(self, rid: int) -> bool:
        return rid in self._matchers

    def accept(self, rid: int, tokens: list[int]) -> bool:
        """Advance rid's matcher over its new tokens; True once its grammar has terminated (the request
        is complete: it should end)."""
        m = self._matchers.get(rid)
        if m is None:
            return False
        for t in tokens:
            if m.is_terminated() or not m.accept_token(t):
                return True
        return m.is_terminated()

    def drop(self, rid: int) -> None:
        self._matchers.pop(rid, None)

    def bitmask(self, rids: list[int | None]) -> tuple[Tensor, list[int]] | None:
        """For a step's sampling rows (their request ids, None where no grammar applies): the packed
        mask [S, ceil(V / 32)] int32 on the host (-1: every token allowed) with each constrained row's
        allowed tokens, and those rows' indices; None when no row is constrained."""
        rows = [i for i, rid in enumerate(rids) if rid is not None and rid in self._matchers]
        if not rows:
            return None
        mask = _xgrammar().allocate_token_bitmask(len(rids), self.vocab_size)  # all -1
        for i in rows:
            self._matchers[rids[i]].fill_next_token_bitmask(mask, i)
        return mask, rows

    @staticmethod
    def apply(logits: Tensor, mask: Tensor, rows: list[int]) -> None:
        """In place on logits [S, V]: row rows[i] keeps only the tokens mask[rows[i]] allows (the others
        -inf); mask: bitmask()'s, on the host. One vectorised op on the logits' device."""
        dev = logits.device
        V = mask.shape[1] * 32
        indices = rows if len(rows) < logits.shape[0] else None
        _xgrammar().apply_token_bitmask_inplace(logits, mask.to(dev, non_blocking=True), vocab_size=V, indices=indices)
        if logits.shape[1] > V:  # columns past the grammar's vocabulary (a padded LM head) are never allowed
            logits[torch.tensor(rows, dtype=torch.int64, device=dev), V:] = float("-inf")


def _regex_literal(s: str) -> str:
    """s as a regex matching exactly s."""
    special = set(r"\.^$|?*+()[]{}/")
    return "".join("\\" + c if c in special else c for c in s)
