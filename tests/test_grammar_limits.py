"""Structured outputs cannot take the server down (issue 39): grammars past lanes' bounds are a
400 before compiling, the rest compile on deep-stack threads, and a grammar that fails while
generating ends its request with an error — never `stop` with output that breaks the grammar.
Negative control: the same chain compiled the old way (a plain thread) kills its process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.grammar import Grammar, GrammarCompiler
from lanes.grammar_limits import MAX_GRAMMAR_RULES, MAX_REF_CHAIN, GrammarTooLarge, check_schema
from tests.live_server import MODEL, LiveServer, assert_serving


def ref_chain(n: int) -> dict:
    """A schema whose $defs chain n $refs deep: d0 -> d1 -> ... -> dn (a string)."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(n: int) -> str:
    return "start: r0\n" + "\n".join(f"r{i}: r{i + 1}" for i in range(n)) + f'\nr{n}: "a"\n'


def gbnf_chain(n: int) -> str:
    rules = "\n".join(f'r{i} ::= "x" r{i + 1} | "y"' for i in range(n))
    return f'root ::= r0\n{rules}\nr{n} ::= "a"\n'


# wide and shallow: 200 properties, each an array of arrays
WIDE = {
    "type": "object",
    "properties": {f"k{i}": {"type": "array", "items": {"type": "array"}} for i in range(200)},
}


@pytest.fixture(scope="module")
def server(long_model_dir):
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16, max_lanes=8))
    with LiveServer(engine) as live:
        yield live


def _chat(extra: dict, stream: bool = False) -> dict:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 12, "stream": stream, **extra}


def test_negative_control_a_plain_thread_dies_on_the_chain(tmp_path, long_model_dir):
    """The old path — llguidance building this chain's matcher on a default-stack thread — kills
    the process; lanes' compiler, its bounds lifted, builds the same chain on its threads."""
    script = textwrap.dedent(
        f"""
        import threading, llguidance
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file({str(long_model_dir / "tokenizer.json")!r})
        tok = llguidance.LLTokenizer(tk.to_str(), n_vocab=tk.get_vocab_size(), eos_token=[0])
        grammar = llguidance.LLMatcher.grammar_from_lark({lark_chain(4000)!r})
        t = threading.Thread(target=lambda: llguidance.LLMatcher(tok, grammar, log_level=0))
        t.start(); t.join()
        print("survived")
        """
    )
    old = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert old.returncode < 0 and b"survived" not in old.stdout, old  # killed by a signal

    import lanes.grammar_limits as limits

    engine = build_engine(str(long_model_dir))
    compiler = GrammarCompiler(engine.tokenizer.to_json(), engine.model_config.vocab_size, [0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limits, "MAX_GRAMMAR_RULES", 10**6)
        cursor = compiler.cursor(Grammar("grammar", lark_chain(4000)))
    assert cursor.allowed([]).any()
    with pytest.raises(GrammarTooLarge, match="rules"):  # and with the bounds, refused first
        compiler.cursor(Grammar("grammar", lark_chain(4000)))


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": ref_chain(1100)}}},
         "$refs chain 1101 deep"),
        ({"guided_json": json.dumps(ref_chain(3000))}, "$refs chain"),
        ({"guided_grammar": lark_chain(3000)}, f"at most {MAX_GRAMMAR_RULES}"),
        ({"guided_grammar": gbnf_chain(3000)}, f"at most {MAX_GRAMMAR_RULES}"),
        ({"guided_json": "[" * 5000 + "]" * 5000}, "nests deeper"),
        ({"guided_json": json.dumps(WIDE)}, None),
        ({"guided_regex": "x" * 300_000}, "characters"),
        ({"guided_json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
         "not valid"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ref_chain(1100)}}],
          "tool_choice": "required"}, "$refs chain"),
    ],
    ids=["schema-1100-refs", "schema-3000-refs", "lark-3000", "gbnf-3000", "string-5000-deep",
         "wide-schema", "huge-regex", "self-reference", "tool-parameters"],
)  # fmt: skip
def test_grammars_past_the_bounds_are_a_400_and_the_server_lives(server, extra, words):
    start = time.perf_counter()
    status, raw = server.post("/v1/chat/completions", _chat(extra))
    took = time.perf_counter() - start
    if words is None:  # wide but shallow: within the bounds, it compiles and runs
        assert status == 200, raw
    else:
        assert status == 400, raw
        message = json.loads(raw)["error"]["message"]
        assert words in message, message
        assert len(message) < 400  # no grammar echoed back, no backtrace
    assert took < 5, took  # the GBNF chain cost 136 s of converting before the bound
    assert_serving(server)


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_regex": "a{1000000}"},
        {"guided_grammar": 'root ::= "ab"{1000000}'},
        {"guided_json": {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                    "required": [f"k{i}"]} for i in range(2500)]}},
    ],
    ids=["regex-repeat", "gbnf-repeat", "anyof-2500"],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_failing_mid_generation_is_an_error_not_stop(server, extra, stream):
    status, raw = server.post("/v1/chat/completions", _chat(extra, stream))
    if not stream:
        assert status == 500, raw
        assert "GrammarFailed" in json.loads(raw)["error"]["message"], raw
    else:
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        finishes = [
            c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])
        ]
        assert finishes[-1] == "error" and "stop" not in finishes, events
        assert "GrammarFailed" in json.loads(events[-2])["error"]["message"], events
    assert_serving(server)


def test_the_cursor_raises_when_the_engine_errs(long_model_dir):
    """Unit level: the mask of a matcher in error is EOS only; the cursor refuses to hand it out
    (negative control: the mask it would have returned allows nothing but EOS)."""
    from lanes.grammar import GrammarFailed

    engine = build_engine(str(long_model_dir))
    params = SamplingParams(max_tokens=12, grammar=Grammar("regex", "a{1000000}"))
    out = engine.generate(["hi"], params)[0]
    assert out.finish_reason == "error" and "GrammarFailed" in out.error, out
    cursor = engine.grammars.cursor(Grammar("regex", "a{1000000}"))
    a = engine.tokenizer.encode("a", add_special_tokens=False)
    history: list[int] = []
    with pytest.raises(GrammarFailed):
        for _ in range(12):
            history += a
            cursor.allowed(history)
    bits = cursor._matcher.compute_bitmask()
    allowed = {i for i in range(engine.model_config.vocab_size) if bits[i // 8] >> (i % 8) & 1}
    assert allowed <= set(engine.eos_token_ids), allowed


def test_schema_bounds_walk_without_recursion():
    deep: dict = {"type": "string"}
    for _ in range(100_000):  # far past Python's recursion limit
        deep = {"items": deep}
    with pytest.raises(GrammarTooLarge, match="nests deeper"):
        check_schema(deep)
    check_schema(ref_chain(MAX_REF_CHAIN - 1))
    with pytest.raises(GrammarTooLarge, match="chain"):
        check_schema(ref_chain(MAX_REF_CHAIN))
    recursive = {"$defs": {"node": {"properties": {"next": {"$ref": "#/$defs/node"}}}},
                 "$ref": "#/$defs/node"}  # fmt: skip
    check_schema(recursive)  # a recursive schema is legal


def test_deep_stack_threads_run_calls_and_hand_back_errors():
    from lanes.deep_stack import DeepStackThreads

    threads = DeepStackThreads(1, "t")
    assert threads.stack_bytes >= 64 * 2**20
    assert threads.run(lambda: 6 * 7, timeout=5) == 42
    with pytest.raises(ZeroDivisionError):
        threads.run(lambda: 1 / 0, timeout=5)
    with pytest.raises(TimeoutError):
        threads.run(lambda: time.sleep(1), timeout=0.05)
    assert threads.run(lambda: "after", timeout=5) == "after"  # the late call done, the next runs
