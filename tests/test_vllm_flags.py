"""A vLLM launch line starts `lanes serve`: every flag issue 43 lists is taken, the ones lanes
has do what they do in vLLM, and the others say at startup what lanes does instead."""

from __future__ import annotations

import argparse
import logging
import os

import pytest

import lanes.cli
import lanes.serve_command
from lanes.drafter import make_proposer
from lanes.openai_api import ApiError, parse_request
from lanes.serve_options import dtype_name, human_int, speculative_options
from lanes.vllm_flags import VLLM_FLAGS, notices

# What a vLLM user's launch script carries (issue 43's list), with values that change something.
VLLM_LINE = [
    "--enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager",
    "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
    "--reasoning-parser", "step3", "--trust-remote-code", "--generation-config", "auto",
    "--uvicorn-log-level", "warning", "--quantization", "awq", "--kv-cache-dtype", "fp8",
    "--max-logprobs", "5", "--structured-outputs-config", '{"backend": "xgrammar"}',
    "--lora-modules", "sql=/adapters/sql", "--root-path", "/llm", "--disable-log-stats",
    "--disable-log-requests", "--block-size", "32", "--download-dir", "/tmp/hub",
    "--revision", "main", "--hf-token", "hf_x", "--load-format", "safetensors",
    "--swap-space", "4", "--dtype", "half", "--max-model-len", "1k",
]  # fmt: skip


def test_a_vllm_launch_line_starts_lanes_serve(long_model_dir, monkeypatch, caplog):
    served = {}
    monkeypatch.setattr(
        lanes.serve_command,
        "serve_engine",
        lambda engine, sock, **kw: sock.close() or served.update(engine=engine, **kw),
    )
    monkeypatch.setenv("HF_TOKEN", "before")  # restored afterwards: --hf-token sets it
    with caplog.at_level(logging.WARNING, logger="lanes"):
        argv = ["serve", str(long_model_dir), "--device", "cpu", "--port", "0", *VLLM_LINE]
        assert lanes.cli.main(argv) == 0
    engine = served["engine"]
    cfg = engine.config
    # honoured: what vLLM does with them
    assert (cfg.cuda_graphs, cfg.block_size, cfg.dtype) == (False, 32, "float16")
    assert engine.context_len == 1000 and cfg.prompt_cache_bytes > 0
    assert (served["max_logprobs"], served["log_stats"], served["log_requests"]) == (
        5,
        False,
        False,
    )
    assert (served["log_level"], served["root_path"]) == ("warning", "/llm")
    assert os.environ["HF_TOKEN"] == "hf_x"
    # the others: one line each saying what lanes does instead
    said = "\n".join(r.getMessage() for r in caplog.records)
    for flag in ("--tool-call-parser", "--reasoning-parser", "--trust-remote-code",
                 "--generation-config", "--quantization", "--kv-cache-dtype",
                 "--structured-outputs-config", "--lora-modules", "--swap-space"):  # fmt: skip
        assert flag in said, flag
    assert "--enforce-eager" not in said and "--block-size" not in said  # honoured: no notice


def test_no_prefix_caching_turns_the_prompt_cache_off(llama_dir, monkeypatch):
    served = {}
    monkeypatch.setattr(
        lanes.serve_command,
        "serve_engine",
        lambda e, sock, **kw: sock.close() or served.update(e=e),
    )
    argv = ["serve", str(llama_dir), "--device", "cpu", "--no-enable-prefix-caching", "--port", "0"]
    assert lanes.cli.main(argv) == 0
    assert served["e"].config.prompt_cache_bytes == 0


def test_every_flag_is_honoured_or_has_a_notice_for_a_changed_value():
    parser = lanes.cli.build_parser()
    defaults = vars(parser.parse_args(["serve"]))
    for flag in VLLM_FLAGS:
        assert flag.dest in defaults, flag.name
        assert flag.notice(defaults[flag.dest]) is None, flag.name  # defaults say nothing


def test_negative_control_a_silent_flag_is_found():
    """The test above would pass for a flag whose notice never speaks; the launch-line test
    names each flag that must speak, so a silenced one fails there."""
    args = lanes.cli.build_parser().parse_args(["serve", "--swap-space", "4"])
    assert any("--swap-space" in line for line in notices(args))
    args.swap_space = None
    assert not any("--swap-space" in line for line in notices(args))


@pytest.mark.parametrize(
    "text, value",
    [("32768", 32768), ("32k", 32000), ("25.6k", 25600), ("32K", 32768), ("1m", 1_000_000),
     ("2G", 2 * 2**30)],
)  # fmt: skip
def test_counts_as_vllm_reads_them(text, value):
    assert human_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "k", "12x", "-3", ""])
def test_bad_counts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_int(text)


def test_dtype_names_as_vllm_takes_them():
    assert [dtype_name(t) for t in ("half", "float", "bfloat16", "auto")] == [
        "float16",
        "float32",
        "bfloat16",
        "auto",
    ]
    with pytest.raises(argparse.ArgumentTypeError):
        dtype_name("fp8")


def test_vllms_ngram_example_is_lanes_prompt_lookup(llama_dir):
    text = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'
    assert speculative_options(text) == ("ngram:1-4", 5)
    from lanes.models import open_checkpoint

    proposer = make_proposer("ngram:1-4", None, open_checkpoint(str(llama_dir)))
    assert (proposer.min_n, proposer.max_n) == (1, 4)
    with pytest.raises(ValueError, match="prompt_lookup_min 5 > max 4"):
        speculative_options('{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 4}')


def test_max_logprobs_caps_what_a_request_may_ask():
    body = {"prompt": "hi", "logprobs": 6}
    assert parse_request(body, chat=False, context_len=64).logprobs == 6
    with pytest.raises(ApiError, match=r"\[0, 5\]"):
        parse_request(body, chat=False, context_len=64, max_logprobs=5)
