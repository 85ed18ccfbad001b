"""lm-evaluation-harness against `lanes serve` in `make serve`'s configuration (the default model
and its shipped drafter): its `local-completions` model runs a small local multiple-choice task
(bench/data/lm_eval/everyday_mc.jsonl, 20 questions: loglikelihood requests, i.e. `echo` with
`logprobs` and `max_tokens` 1), against that server and against one without a drafter; the
loglikelihoods must be equal. lm-eval is not a lanes dependency; give the python of an
environment that has it:

    python -m venv /tmp/lmvenv && /tmp/lmvenv/bin/pip install "lm-eval[api]" transformers
    python -m bench.serving lm-eval --lm-eval-python /tmp/lmvenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import DATA, RESULTS, ROOT

DRAFTER = str(ROOT / "drafter" / "weights" / "smollm2-135m-instruct+ngram")
TASK = """task: lanes_everyday_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def serve(drafter: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "lanes.cli", "serve", "--port", str(port), "--drafter", drafter]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("lanes serve exited") from None
            time.sleep(0.5)


def tokenizer_dir() -> str:
    out = subprocess.run([sys.executable, "-m", "lanes.cli", "models"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    line = next(line for line in out.splitlines() if line.strip().startswith("tokenizer"))
    return line.split()[1]


def run_task(python: str, port: int, tokenizer: str, name: str, workdir: Path) -> dict:
    tasks = workdir / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "lanes_everyday_mc.yaml").write_text(
        TASK.format(data=DATA / "lm_eval" / "everyday_mc.jsonl")
    )
    out = workdir / f"out-{name}"
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())
    model_args = (
        f"model={models['data'][0]['id']},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={tokenizer},num_concurrent=1,max_retries=1,tokenized_requests=True"
    )
    cmd = [python, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
           "--tasks", "lanes_everyday_mc", "--include_path", str(tasks), "--output_path", str(out),
           "--log_samples"]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    started = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(run.stderr[-3000:])
    result = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for f in out.rglob("samples_*.jsonl") for line in f.open()]
    return {
        "acc": result["results"]["lanes_everyday_mc"]["acc,none"],
        "seconds": time.perf_counter() - started,
        "loglikelihoods": [s["resps"] for s in sorted(samples, key=lambda s: s["doc_id"])],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lm-eval-python", required=True, help="a python that has lm-eval")
    ap.add_argument("--out", default=str(RESULTS / "lm-eval-cpu.json"))
    args = ap.parse_args()
    tok, runs = tokenizer_dir(), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, drafter in (("make serve", DRAFTER), ("no drafter", "none")):
            proc, port = serve(drafter)
            try:
                runs[name] = run_task(args.lm_eval_python, port, tok, name.replace(" ", "-"),
                                      Path(tmp))  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
    report = {
        "task": "lanes_everyday_mc (20 questions, 4 choices: 80 loglikelihood requests)",
        "machine": "CPU (the dev box)",
        "acc": {name: r["acc"] for name, r in runs.items()},
        "seconds": {name: round(r["seconds"], 1) for name, r in runs.items()},
        "loglikelihoods_equal": runs["make serve"]["loglikelihoods"]
        == runs["no drafter"]["loglikelihoods"],
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
