"""`lanes generate`: JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys


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
