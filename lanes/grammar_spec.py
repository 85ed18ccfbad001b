"""What a request's output must match (structured outputs), as plain data: the spec that
sampling parameters carry. Compiling and matching it is lanes/grammar.py's job."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

KINDS = (
    "json_schema",
    "regex",
    "choice",
    "grammar",  # a request's grammar: GBNF (llama.cpp's, the EBNF vLLM takes) or Lark
    "lark",
)  # lark: internal (tool calls), not a request field


@dataclass(frozen=True)
class Grammar:
    """What the output must match, as plain data: a JSON schema (as JSON text), a regex, a
    JSON list of the allowed strings, a request's GBNF or Lark grammar, or an llguidance Lark
    grammar of lanes' own."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, not {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict) -> Grammar:
        return cls("json_schema", json.dumps(schema, sort_keys=True))

    @classmethod
    def choice(cls, choices: Sequence[str]) -> Grammar:
        return cls("choice", json.dumps(list(choices)))
