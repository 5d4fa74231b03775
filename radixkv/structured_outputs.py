"""StructuredOutputsParams: what a request's output must match (vLLM's name and fields). No torch.

Exactly one of: `json` (a JSON schema, as a dict or its text), `regex`, `choice` (the output is one of
these strings), `grammar` (an EBNF grammar, as xgrammar reads it: `root ::= ...`), or `json_object`
(any JSON object: OpenAI's response_format json_object). The engine compiles it to a token grammar
(radixkv/engine/grammar.py, xgrammar) and masks every step's logits with it.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """See the module docstring. ValueError naming the field for a malformed value."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        given = [k for k in KINDS if (getattr(self, k) not in (None, False))]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) or 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = json.loads(self.json)
                except ValueError as err:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {err}") from None
            else:
                parsed = self.json
            if not isinstance(parsed, Mapping):
                raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(parsed).__name__}")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {v!r}")
        if self.choice is not None:
            c = self.choice
            if isinstance(c, (str, bytes, Mapping)) or not isinstance(c, Sequence) or not c \
                    or not all(isinstance(x, str) and x for x in c):
                raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, got {c!r}")
            object.__setattr__(self, "choice", tuple(c))
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")

    @classmethod
    def coerce(cls, value: Any) -> StructuredOutputsParams | None:
        """A StructuredOutputsParams from itself, a dict of its fields, or None."""
        if value is None or isinstance(value, StructuredOutputsParams):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - set(KINDS)
            if unknown:
                raise ValueError(f"structured_outputs has unknown keys {sorted(unknown)}; expected one of {KINDS}")
            return cls(**{k: v for k, v in value.items() if v is not None})
        raise ValueError(f"structured_outputs must be a StructuredOutputsParams or a dict, got {value!r}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): the compile cache's key and what is compiled. A schema keeps its key order: the
        grammar writes an object's properties in the schema's order (as vLLM's; a "reasoning" field before an
        "answer" field is the point of many schemas)."""
        kind = self.kind
        if kind == "json":
            spec = json.dumps(json.loads(self.json) if isinstance(self.json, str) else self.json)
        elif kind == "choice":
            spec = json.dumps(list(self.choice or ()))
        elif kind == "json_object":
            spec = ""
        else:
            spec = getattr(self, kind)
        return kind, spec
