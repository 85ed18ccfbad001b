"""One wheel fetched from the package index, with a progress line: through pip where this
Python has it (it knows the user's index settings and proxies), else straight from the index's
JSON simple API (PEP 691) with urllib — a venv made by uv has no pip module — checking the
file's SHA-256 against the index."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from lanes.config import index_url

CHUNK = 1 << 20


class FetchError(RuntimeError):
    pass


def fetch_wheel(requirement: str, into: Path) -> Path:
    """The wheel of `name==version`, downloaded into `into`."""
    if importlib.util.find_spec("pip") is not None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(into)]
        # pip's own progress bar goes to the terminal; its errors are kept for the message
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        wheels = list(into.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise FetchError(f"pip could not fetch {requirement}: {last}")
        return wheels[0]
    return fetch_from_index(requirement, into, index_url())


def fetch_from_index(requirement: str, into: Path, index: str) -> Path:
    name, _, version = requirement.partition("==")
    project = name.lower().replace("_", "-")
    page = urllib.parse.urljoin(index.rstrip("/") + "/", f"{project}/")
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            files = json.loads(r.read())["files"]
    except (OSError, ValueError, KeyError) as e:
        raise FetchError(f"could not read {page}: {e}") from e
    prefix = f"{project.replace('-', '_')}-{version}-"
    wheel = next((f for f in files if f["filename"].startswith(prefix)
                  and f["filename"].endswith(".whl")), None)  # fmt: skip
    if wheel is None:
        raise FetchError(f"{page} lists no wheel of {requirement}")
    target = into / wheel["filename"]
    digest = hashlib.sha256()
    url = urllib.parse.urljoin(page, wheel["url"])
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(target, "wb") as out:
            total, done, shown = int(r.headers.get("Content-Length") or 0), 0, 0.0
            while chunk := r.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if time.monotonic() - shown > 0.5 or done == total:
                    shown = time.monotonic()
                    _progress(wheel["filename"], done, total)
    except OSError as e:
        raise FetchError(f"could not download {url}: {e}") from e
    print(file=sys.stderr, flush=True)
    want = wheel.get("hashes", {}).get("sha256")
    if want and digest.hexdigest() != want:
        target.unlink()
        raise FetchError(f"{wheel['filename']}: SHA-256 differs from the index's")
    return target


def _progress(name: str, done: int, total: int) -> None:
    size = f"{done / 1e6:.1f} / {total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
    print(f"\rlanes: fetching {name}: {size}", end="", file=sys.stderr, flush=True)
