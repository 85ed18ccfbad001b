"""The import structure: one direction, no circles, and install names that cannot collide.

Layers, top to bottom; a module imports only its own layer and the ones below (function-level
imports count too: a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent

# (layer, module prefixes); the first matching prefix, longest first, names a module's layer
LAYERS = [
    # the API and tools that build engines: the CLI, the server, `lanes distill`
    ("api", ["lanes", "lanes.cli", "lanes.serve_options", "lanes.server", "lanes.openai_api",
             "lanes.async_engine", "lanes.drafter.distill", "lanes.utility_api",
             "lanes.server_metrics", "lanes.tools", "lanes.http_protocol", "lanes.responses"]),
    ("build", ["lanes.build", "lanes.warmup"]),  # the composition root
    ("engine", ["lanes.engine", "lanes.share", "lanes.metrics", "lanes.speculation",
                "lanes.inflight", "lanes.draft_costs", "lanes.recurrent",
                "lanes.launched_chunks", "lanes.round_clock", "lanes.mask_budget",
                "lanes.mask_prefetch"]),
    ("drafter", ["lanes.drafter"]),
    ("runner", ["lanes.runner", "lanes.graphs", "lanes.chain_graphs", "lanes.device_rounds",
                "lanes.parallel", "lanes.block_tables",
                "lanes.device_sampling"]),
    ("models", ["lanes.models"]),
    ("ops", ["lanes.backends", "lanes.ops", "lanes.triton_ops", "lanes.attention"]),
    ("kernels", ["lanes.kernels"]),
    # below all of them: memory, the round plan, requests, config (DESIGN.md)
    ("base", ["lanes.cache", "lanes.rounds", "lanes.lane", "lanes.lane_rows", "lanes.sampling",
              "lanes.penalties",
              "lanes.grammar", "lanes.grammar_limits", "lanes.deep_stack", "lanes.prompt_bounds",
              "lanes.config",
              "lanes.batch", "lanes.tokenizer", "lanes.chat", "lanes.detokenize",
              "lanes.packed", "lanes._source_tree"]),
]  # fmt: skip
FOLDERS = {"lanes": "lanes", "kernels": "lanes.kernels", "cache": "lanes.cache",
           "drafter": "lanes.drafter"}  # fmt: skip


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            mods[name.removesuffix(".__init__")] = path
    return mods


def _layer(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{module} is in no layer"
    return best[0]


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n in mods}
    return out


def test_imports_go_down_only():
    mods = _modules()
    upward = []
    for name, path in mods.items():
        for target in _imports(path, mods) - {name}:
            if _layer(target) < _layer(name):
                upward.append(f"{name} ({LAYERS[_layer(name)][0]}) imports {target} "
                              f"({LAYERS[_layer(target)][0]})")  # fmt: skip
    assert not upward, "\n".join(upward)


# What the runner builds forwards from is plain data (lanes.lane_rows): it never reads the
# scheduler's lanes or steps.
RUNNER_SIDE = ["lanes.runner", "lanes.graphs", "lanes.chain_graphs", "lanes.batch",
               "lanes.block_tables"]  # fmt: skip
SCHEDULER_TYPES = {"lanes.lane", "lanes.rounds"}


def _scheduler_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    return {t for t in _imports(path, mods) if t.rsplit(".", 1)[0] in SCHEDULER_TYPES or t in
            SCHEDULER_TYPES}  # fmt: skip


def test_the_runner_takes_plain_data():
    mods = _modules()
    leaks = {m: _scheduler_imports(mods[m], mods) for m in RUNNER_SIDE}
    assert not any(leaks.values()), leaks


def test_negative_control_a_lane_import_on_the_runner_side_is_found(tmp_path):
    mods = _modules()
    leaky = tmp_path / "runner.py"
    leaky.write_text(mods["lanes.runner"].read_text() + "\nfrom lanes.lane import Lane\n")
    assert _scheduler_imports(leaky, mods) == {"lanes.lane"}


# Kernels take tensors and plain numbers: never a forward's batch or the scheduler's objects.
# (kernels/sampling.py's reference still reads lanes.sampling's SamplingParams: issue 40.)
RUNTIME_TYPES = {"lanes.batch", "lanes.lane", "lanes.rounds", "lanes.lane_rows", "lanes.engine"}


def _runtime_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    return _imports(path, mods) & RUNTIME_TYPES


def test_kernels_take_plain_data():
    mods = _modules()
    leaks = {m: _runtime_imports(p, mods) for m, p in mods.items() if m.startswith("lanes.kernels")}
    assert not any(leaks.values()), leaks


def test_negative_control_a_batch_import_in_a_kernel_is_found(tmp_path):
    mods = _modules()
    leaky = tmp_path / "attention_cpu.py"
    text = mods["lanes.kernels.attention_cpu"].read_text()
    leaky.write_text(text + "\nfrom lanes.batch import ForwardBatch\n")
    assert _runtime_imports(leaky, mods) == {"lanes.batch"}


def test_no_import_circles():
    mods = _modules()
    edges = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    # a package's __init__ re-exporting its submodules is not a circle of concepts
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not circles, "\n".join(circles)


def test_the_code_never_imports_the_bare_folder_names():
    bare = [
        f"{name}: {target}"
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for target in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        if target.split(".")[0] in ("kernels", "cache", "drafter")
    ]
    assert not bare, bare


def test_installs_only_inside_the_lanes_namespace():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "lanes" or p.startswith("lanes.") for p in setup["packages"])
    assert setup["package-dir"]["lanes.kernels"] == "kernels"


def test_lanes_imports_beside_another_distribution_named_kernels(tmp_path):
    """Hugging Face's `kernels` (or any top-level kernels / cache / drafter package) earlier on
    the path must neither break lanes nor be replaced by lanes' folders."""
    for name in ("kernels", "cache", "drafter"):
        (tmp_path / "other" / name).mkdir(parents=True)
        (tmp_path / "other" / name / "__init__.py").write_text(f"WHO = 'other {name}'\n")
    code = (
        "import kernels, cache, drafter\n"
        "import lanes, lanes.cli, lanes.server, lanes.build, lanes.kernels.registry\n"
        "import lanes.drafter.eagle, lanes.drafter.hybrid, lanes.cache.prompt_cache\n"
        "import sys\n"
        "assert [m.WHO for m in (kernels, cache, drafter)] == "
        "['other kernels', 'other cache', 'other drafter']\n"
        "assert sys.modules['kernels'] is kernels and not hasattr(kernels, 'registry')\n"
        f"assert lanes.kernels.__file__.startswith({str(ROOT / 'kernels')!r})\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(tmp_path / "other"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_a_checkout_runs_without_installing():
    """From the repository root with no install (no site hooks: `python -S`, the libraries on
    PYTHONPATH), as bench scripts run on the GPU machine: the folders map to lanes.*."""
    code = (
        "import sys, lanes, lanes.build, lanes.kernels.registry, lanes.drafter.eagle\n"
        "assert any(type(f).__name__ == '_SiblingFinder' for f in sys.meta_path)\n"
        f"assert lanes.cache.__file__ == {str(ROOT / 'cache' / '__init__.py')!r}\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_the_name_kernels_finds_the_distribution_not_the_checkouts_folder(tmp_path):
    """Hugging Face's `kernels` (transformers 5.25 requires and imports it) shares its name with
    the checkout's kernels/ folder, which `python -m pytest` puts first on sys.path. With lanes
    imported, `import kernels` finds the distribution (a stand-in here, after the root on the
    path); without lanes' finder the folder answers, as it did when CI's transformers moved to
    5.25 (the negative control)."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("NAME = 'distribution'\n")
    path = [str(ROOT), str(site), sysconfig.get_paths()["purelib"]]
    found = {}
    for first in ("import lanes", "pass"):
        code = (
            f"import sys\nsys.path[:0] = {path!r}\n{first}\nimport kernels\nprint(kernels.__file__)"
        )
        run = subprocess.run(
            [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        found[first] = Path(run.stdout.strip())
    assert found["import lanes"] == site / "kernels" / "__init__.py"
    assert found["pass"] == ROOT / "kernels" / "__init__.py"
