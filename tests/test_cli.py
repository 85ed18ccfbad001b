"""`lanes generate`: JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _lanes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lanes.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_generate_json(llama_dir):
    done = _lanes(
        "generate",
        "--model",
        str(llama_dir),
        "--prompt",
        "The quick",
        "--max-tokens",
        "5",
        "--json",
        "--raw",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["token_ids"]) <= 5 and out["prompt_ids"] and isinstance(out["text"], str)


def test_generate_seeded_is_reproducible(llama_dir):
    args = ["generate", "--model", str(llama_dir), "--prompt", "hi", "--max-tokens", "6"]
    args += ["--temperature", "1.0", "--seed", "7", "--json"]
    first, second = _lanes(*args), _lanes(*args)
    assert json.loads(first.stdout)["token_ids"] == json.loads(second.stdout)["token_ids"]


def test_bad_model_is_one_line_error():
    done = _lanes("generate", "--model", "/no/such/model", "--prompt", "x")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("lanes: error:")


def test_bad_sampling_is_one_line_error(llama_dir):
    done = _lanes("generate", "--model", str(llama_dir), "--prompt", "x", "--top-p", "2")
    assert done.returncode == 2 and "top_p" in done.stderr


def _broken_config(src, dst, change):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(change(cfg)))
    return dst


def _one_line_error(model, *words, capsys) -> None:
    """`lanes generate --model M` ends in one `lanes: error:` line naming the file and field."""
    from lanes.cli import main

    assert main(["generate", "--model", str(model), "--prompt", "x", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lanes: error:"), err
    assert all(w in lines[0] for w in words), lines[0]


def _without(cfg, key):
    del cfg[key]
    return cfg


def test_bad_config_json_is_one_line_error(llama_dir, tmp_path, capsys):
    cases = {
        "list": (lambda cfg: [cfg], "expected a JSON object"),
        "no-heads": (lambda cfg: _without(cfg, "num_attention_heads"), "'num_attention_heads'"),
        "zero-heads": (lambda cfg: cfg | {"num_attention_heads": 0}, "'num_attention_heads'"),
        "big-vocab": (lambda cfg: cfg | {"vocab_size": "big"}, "'vocab_size'"),
        "bad-eos": (lambda cfg: cfg | {"eos_token_id": "end"}, "'eos_token_id'"),
    }
    for name, (change, field) in cases.items():
        model = _broken_config(llama_dir, tmp_path / name, change)
        _one_line_error(model, "config.json", field, capsys=capsys)


def test_bad_gguf_is_one_line_error(tiny_models, tmp_path, capsys):
    import struct

    from tests.test_gguf import write_gguf

    hf_dir, hf = tiny_models["llama"]
    good = tmp_path / "good.gguf"
    write_gguf(good, hf_dir, hf)
    data = good.read_bytes()
    cases = {
        "truncated.gguf": (data[: len(data) // 2], "cannot read GGUF"),
        "tiny.gguf": (data[:1000], "cannot read GGUF"),
        "many-tensors.gguf": (data[:8] + struct.pack("<Q", 2**62) + data[16:], "2^62"),
        # the first metadata key's length (right after the 24-byte header) says 2^60 bytes
        "huge-string.gguf": (data[:24] + struct.pack("<Q", 2**60) + data[32:], "cannot read GGUF"),
        "not-gguf.gguf": (b"PK\x03\x04" + data[4:], "not a GGUF file"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        words = str(2**62) if words == "2^62" else words
        _one_line_error(path, name, words, capsys=capsys)


def test_the_engine_is_built_on_a_thread_that_exits():
    """`lanes serve` builds its engine on a thread of its own (its OpenMP pool goes with it):
    the value comes back, an error is raised on the caller's thread, and the thread is gone."""
    import threading

    from lanes.cli import _off_the_main_thread

    seen = []

    def build(x, scale=1):
        seen.append(threading.current_thread())
        return x * scale

    assert _off_the_main_thread(build, 3, scale=2) == 6
    assert seen[0] is not threading.main_thread() and not seen[0].is_alive()

    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        _off_the_main_thread(broken)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--chat-template", "/typo/path.jinja"], "not a readable file"),
        (["--chat-template", "."], "not a readable file"),  # a directory
        (["--chat-template", "{% for m in messages %}{{ m.content }"], "does not compile"),
        (["--chat-template", "{{ messages[5].content.upper() }}"], "chat template failed"),
        (["--kv-cache-bytes", "1TiB"], "more than the cpu memory"),
        (["--device", "cuda"], "no CUDA device"),
    ],
)
def test_serve_operator_errors_are_one_line(llama_dir, capsys, flags, words):
    """Each is found before the model loads; none serves wrong answers or ends in a traceback
    (before: a typo'd template path became the template; 1TiB was tried)."""
    from lanes.cli import main

    if "cuda" in flags:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    assert main(["serve", "--model", str(llama_dir), "--device", "cpu", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lanes: error:") and words in err[0], err


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--kv-cache-bytes", "1e400"], "more bytes than any machine has"),
        (["--kv-cache-bytes", "0"], "--kv-cache-bytes"),
        (["--port", "70000"], "at most 65535"),
        (["--device", "bogus"], "cpu, cuda or cuda:N"),
        (["--tensor-parallel", "0"], "at least 1"),
        (["--tensor-parallel", "-1"], "at least 1"),
        (["--max-tokens-per-round", "0"], "at least 1"),
    ],
)
def test_serve_flag_values_are_checked(llama_dir, capsys, flags, words):
    from lanes.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", str(llama_dir), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


def _with_index(cfg, index, dst):
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return cfg


def test_lying_model_files_are_one_line_errors(llama_dir, tmp_path, capsys):
    """Issue 39's model files: configs that would allocate GiBs before any weight is read, a
    context of 0, and shard indexes that are not maps or point outside the model's folder."""
    cases = {
        "layers": (lambda cfg: cfg | {"num_hidden_layers": 10**9}, "num_layers is 1000000000"),
        "context-huge": (lambda cfg: cfg | {"max_position_embeddings": 10**12}, "at most"),
        "context-zero": (lambda cfg: cfg | {"max_position_embeddings": 0}, "at least 2"),
        "vocab-huge": (lambda cfg: cfg | {"vocab_size": 2**30}, "vocab_size is"),
    }
    for name, (change, words) in cases.items():
        model = _broken_config(llama_dir, tmp_path / name, change)
        _one_line_error(model, "config.json", words, capsys=capsys)
    (tmp_path / "other").mkdir()
    indexes = {
        "index-list": (["model.safetensors"], "weight_map"),
        "index-no-map": ({"metadata": {}}, "weight_map"),
        "index-outside": ({"weight_map": {"lm_head.weight": "../other/model.safetensors"}},
                          "outside the model's directory"),
        "index-absolute": ({"weight_map": {"x": str(llama_dir / "model.safetensors")}},
                           "outside the model's directory"),
    }  # fmt: skip
    for name, (index, words) in indexes.items():
        dst = tmp_path / name
        _broken_config(llama_dir, dst, lambda cfg, i=index, d=dst: _with_index(cfg, i, d))
        _one_line_error(dst, "model.safetensors.index.json", words, capsys=capsys)


def test_max_model_len_shrinks_the_context_tables(long_model_dir):
    """--max-model-len sizes the RoPE tables (before: always the model's own context)."""
    from lanes import EngineConfig, SamplingParams, build_engine

    full = build_engine(str(long_model_dir))
    short = build_engine(str(long_model_dir), EngineConfig(max_model_len=256))
    assert full.runner.decoder.cos.shape[0] == 4096 and short.runner.decoder.cos.shape[0] == 256
    assert short.context_len == 256
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert [c.token_ids for c in short.generate(["hello there"], params)] == [
        c.token_ids for c in full.generate(["hello there"], params)
    ]


def test_an_all_moe_config_needs_no_intermediate_size(tiny_models, tmp_path):
    """transformers 5.25 saves Qwen3.5-MoE's text config without intermediate_size (no layer
    has a dense MLP): it loads, and gives the same tokens."""
    from lanes import SamplingParams, build_engine

    src = tiny_models["qwen3_5_moe"][0]
    model = _broken_config(src, tmp_path / "moe", lambda cfg: _without_everywhere(cfg))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = build_engine(str(src)).generate(["hello"], params)[0].token_ids
    assert build_engine(str(model)).generate(["hello"], params)[0].token_ids == want


def _without_everywhere(cfg):
    cfg.pop("intermediate_size", None)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"].pop("intermediate_size", None)
    return cfg


def test_a_taken_port_is_an_error_before_the_model_loads(capsys, monkeypatch):
    """Before: the port was found taken only once the model had loaded (52 s on the dev box)."""
    import socket

    import lanes.serve_command
    from lanes.cli import main

    loaded = []
    monkeypatch.setattr(
        lanes.serve_command, "_off_the_main_thread", lambda *a, **k: loaded.append(1)
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--device", "cpu", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen" in err and not loaded


def test_a_mistyped_flag_gets_a_suggestion_and_help_is_quick(capsys):
    import subprocess
    import sys
    import time

    from lanes.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--prefil-share", "0.3"])
    assert "--prefil-share (did you mean --prefill-share?)" in capsys.readouterr().err
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "lanes.cli", "--help"], capture_output=True)
    assert run.returncode == 0 and time.perf_counter() - started < 1.0
    probe = "import sys, lanes.cli; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
        == "False\n"
    )
