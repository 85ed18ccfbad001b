"""Bounds a structured-output grammar must keep before lanes compiles it.

The grammar engine (llguidance, native code) recurses over a grammar's rules while it builds a
matcher: a chain of a few thousand `$ref`s or rules overflows a default 8 MiB thread stack and
kills the process (SIGSEGV, no Python exception). lanes compiles on threads with a large stack
(lanes/grammar.py) and, before that, refuses grammars past these bounds, each far below what
that stack holds (a 30,000-rule chain compiled there; these allow at most a few hundred).
llguidance's GBNF converter is Python and quadratic in the number of rules (2,000 chained rules:
~2.5 s holding the GIL), so the rule bound also keeps the conversion to a fraction of a second.

Every check walks its input iteratively: a hostile schema cannot overflow Python's stack either.
"""

from __future__ import annotations

import re
from typing import Any

MAX_GRAMMAR_CHARS = 256 * 1024  # a schema (as JSON text), regex, grammar or list of choices
MAX_GRAMMAR_RULES = 512  # rules of a GBNF or Lark grammar
MAX_SCHEMA_DEPTH = 64  # objects and arrays nested in a JSON schema
MAX_REF_CHAIN = 128  # `$ref`s a JSON schema resolves one after another

# A rule's definition starts a line: GBNF `name ::=`, Lark `name:` / `?name:` / `NAME.2:`.
_GBNF_RULE = re.compile(r"^\s*[A-Za-z0-9_-]+\s*::=", re.MULTILINE)
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?\s*:(?!:)", re.MULTILINE)


class GrammarTooLarge(ValueError):
    """A grammar past one of the bounds above: the request's error, before any compiling."""


def check_size(kind: str, source: str) -> None:
    if len(source) > MAX_GRAMMAR_CHARS:
        raise GrammarTooLarge(
            f"the {kind} has {len(source)} characters; lanes compiles at most {MAX_GRAMMAR_CHARS}"
        )


def check_rules(source: str) -> None:
    """A GBNF or Lark grammar's rule count."""
    num_rules = len(_GBNF_RULE.findall(source)) + len(_LARK_RULE.findall(source))
    if num_rules > MAX_GRAMMAR_RULES:
        raise GrammarTooLarge(
            f"the grammar has {num_rules} rules; lanes compiles at most {MAX_GRAMMAR_RULES}"
        )


def check_schema(schema: Any) -> None:
    """A JSON schema's nesting depth and its longest chain of `$ref`s (local ones, `#/...`)."""
    stack = [(schema, 1)]
    refs: dict[str, list[str]] = {}  # a subschema's JSON pointer -> the $refs inside it
    pointers = [("#", schema)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarTooLarge(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value
        for child in children if isinstance(value, dict | list) else ():
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    for section in ("$defs", "definitions"):
        defs = schema.get(section) if isinstance(schema, dict) else None
        if isinstance(defs, dict):
            pointers += [(f"#/{section}/{name}", sub) for name, sub in defs.items()]
    for pointer, sub in pointers:
        refs[pointer] = _refs_in(sub, skip_defs=pointer == "#")
    longest = _longest_chain(refs)
    if longest > MAX_REF_CHAIN:
        raise GrammarTooLarge(
            f"the JSON schema's $refs chain {longest} deep; lanes follows at most {MAX_REF_CHAIN}"
        )


def _refs_in(schema: Any, skip_defs: bool) -> list[str]:
    """The local $refs inside one subschema, not those of the definitions it holds."""
    found, stack = [], [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                found.append(ref)
            for key, child in value.items():
                if not (skip_defs and value is schema and key in ("$defs", "definitions")):
                    stack.append(child)
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _longest_chain(refs: dict[str, list[str]]) -> int:
    """The most $refs followed one after another from the root, a cycle counted once round
    (a recursive schema is legal: the engine expands it as the output grows, not at compile).
    Iterative depth-first search; a pointer's depth is kept once its subtree is done."""
    done: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[str, int]] = [("#", 0)]
    while stack:
        pointer, next_child = stack.pop()
        targets = refs.get(pointer, [])
        if next_child == 0:
            on_path.add(pointer)
        if next_child < len(targets):
            stack.append((pointer, next_child + 1))
            target = targets[next_child]
            if target in refs and target not in done and target not in on_path:
                stack.append((target, 0))
            continue
        on_path.discard(pointer)
        done[pointer] = max(
            (1 + done.get(t, 0) for t in targets if t in refs), default=len(targets) > 0
        )
    return done.get("#", 0)
