"""Structured outputs: a request's output held to a JSON schema, a regex, a list of choices or a
grammar (GBNF or Lark).

The grammar engine is llguidance (the one vLLM and llama.cpp use; a Rust core with no Python
dependencies). A grammar's mask for the next token is a function of the tokens before it, so it
joins the logits processing of lanes/penalties.py: a position's masked logits are the same
whether it is decoded alone or verified behind drafts, and drafted output equals undrafted under
a grammar. A draft the grammar forbids is simply rejected: its row's sample comes from the masked
logits and cannot equal it.

JSON is compact (no whitespace between tokens of the JSON): a model cannot stall on spaces.

Compiling is contained: a grammar past lanes.grammar_limits' bounds is refused before it reaches
the engine, the rest compile on threads with a large stack (lanes/deep_stack.py) within a
timeout, and llguidance's parser limits bound each mask's work. A matcher that hits a limit while
generating raises GrammarFailed: the lane ends with finish_reason "error", never "stop" with
output that breaks its grammar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from lanes.deep_stack import DeepStackThreads
from lanes.grammar_limits import GrammarTooLarge, check_rules, check_schema, check_size
from lanes.grammar_spec import Grammar

__all__ = ["Grammar", "GrammarCompiler", "GrammarCursor", "GrammarFailed", "apply_mask"]

COMPILE_TIMEOUT_S = 10.0  # a grammar still compiling after this is the request's 400
COMPILE_THREADS = 2


class GrammarFailed(RuntimeError):
    """The grammar engine stopped while generating (a limit hit, an inconsistent grammar): the
    lane cannot go on and must not end as if its output matched."""


def _llguidance_text(grammar: Grammar) -> str:
    """The grammar in llguidance's form, after the bounds of lanes.grammar_limits."""
    import llguidance

    check_size("tool call grammar" if grammar.kind == "lark" else grammar.kind, grammar.source)
    if grammar.kind == "json_schema":
        check_schema(json.loads(grammar.source))
        return llguidance.LLMatcher.grammar_from_json_schema(
            grammar.source, {"whitespace_flexible": False}
        )
    if grammar.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    if grammar.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(grammar.source)
    if grammar.kind == "grammar":
        from llguidance.gbnf_to_lark import any_to_lark

        check_rules(grammar.source)

        try:  # Lark as it is (a `start:` rule), GBNF (`root ::= ...`) converted to it
            lark = any_to_lark(grammar.source)
        except Exception as e:  # the converter raises plain Exceptions too
            raise ValueError(str(e)) from e
        return llguidance.LLMatcher.grammar_from_lark(lark)
    alternatives = "|".join(_regex_literal(c) for c in json.loads(grammar.source))
    return llguidance.LLMatcher.grammar_from_regex(f"({alternatives})")


def _regex_literal(text: str) -> str:
    return "".join(f"\\{c}" if c in r"\.^$|?*+()[]{}" else c for c in text)


class GrammarCompiler:
    """Builds matchers for one tokenizer (the engine's). The tokenizer conversion runs once."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]) -> None:
        import llguidance

        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=sorted(eos_ids)
        )
        # llguidance's defaults, with error messages that do not echo the grammar back
        self._limits = llguidance.LLParserLimits(verbose_errors=False)
        self._threads = DeepStackThreads(COMPILE_THREADS, "lanes-grammar")

    def cursor(self, grammar: Grammar) -> GrammarCursor:
        """A fresh matcher for one lane; a ValueError naming what is wrong with a grammar that
        does not compile (an unknown schema type, a regex that does not parse, a bound of
        lanes.grammar_limits passed, a limit hit at the first token, a compile too slow)."""
        try:
            matcher = self._threads.run(lambda: self._compile(grammar), COMPILE_TIMEOUT_S)
        except TimeoutError as e:
            raise ValueError(
                f"the {grammar.kind} took over {COMPILE_TIMEOUT_S:g} s to compile"
            ) from e
        return GrammarCursor(matcher, self.vocab_size, self._tokenizer.eos_tokens)

    def _compile(self, grammar: Grammar):
        """On a deep-stack thread: the matcher, its first mask computed (where many limits
        show), or a ValueError."""
        import llguidance

        try:
            text = _llguidance_text(grammar)
        except RecursionError as e:  # the converters are Python, and recursive
            raise ValueError(f"the {grammar.kind} nests too deep to compile") from e
        except GrammarTooLarge:
            raise
        except ValueError as e:
            raise ValueError(f"the {grammar.kind} is not valid: {_brief(str(e))}") from e
        matcher = llguidance.LLMatcher(self._tokenizer, text, log_level=0, limits=self._limits)
        if not matcher.is_error():
            matcher.compute_bitmask()
        if matcher.is_error():
            raise ValueError(f"the {grammar.kind} is not valid: {_brief(matcher.get_error())}")
        return matcher


def _brief(message: str) -> str:
    """An error's first line, short: llguidance's panics carry backtraces, and a parse error
    quotes the grammar it was given."""
    return message.strip().splitlines()[0][:200] if message.strip() else "unknown error"


class GrammarCursor:
    """One lane's matcher, moved to whatever output it is asked about: rolled back to the part
    it shares with what it consumed, then fed the rest. Tokens the grammar forbids (a rejected
    draft) are never fed; positions after one are never sampled from."""

    def __init__(self, matcher, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos_ids = [t for t in eos_ids if t < vocab_size]
        self._consumed: list[int] = []

    def allowed(self, output_ids: Sequence[int]) -> torch.Tensor:
        """Bool [vocab]: the tokens the grammar allows after output_ids. Past the grammar's end
        (an EOS kept by ignore_eos) nothing is left to allow: EOS then, never an empty row."""
        self._move_to(list(output_ids))
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        if self._matcher.is_error():  # its mask is then EOS only: not an end the grammar allows
            raise GrammarFailed(f"the grammar engine stopped: {_brief(self._matcher.get_error())}")
        mask = np.unpackbits(bits, bitorder="little")[: self._vocab_size].astype(bool)
        if mask.shape[0] < self._vocab_size:  # ids past the tokenizer's: never allowed
            mask = np.concatenate([mask, np.zeros(self._vocab_size - mask.shape[0], bool)])
        if not mask.any():
            mask[self._eos_ids] = True
        return torch.from_numpy(mask)

    def _move_to(self, output: list[int]) -> None:
        shared = len(self._consumed)
        if output[:shared] != self._consumed:  # drafts changed: find where they part
            shared, limit = 0, min(len(output), len(self._consumed))
            while shared < limit and output[shared] == self._consumed[shared]:
                shared += 1
        if shared < len(self._consumed):
            self._matcher.rollback(len(self._consumed) - shared)
            del self._consumed[shared:]
        rest = output[shared:]
        valid = self._matcher.validate_tokens(rest) if rest else 0
        if valid:
            self._matcher.consume_tokens(rest[:valid])
            self._consumed += rest[:valid]


def apply_mask(row: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """row [vocab] float32 with the forbidden tokens at -inf (allowed: the cursor's mask, already
    the model's vocabulary long)."""
    return row.float().masked_fill(~allowed.to(row.device), float("-inf"))
