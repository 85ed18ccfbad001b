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

# (layer, module prefixes); the first matching prefix, longest first, names a module's layer.
# The engine's parts have layers of their own (DESIGN.md): the loop, then the rounds that take a
# step's place, round execution, failure isolation, the parts it composes, the scheduler.
LAYERS = [
    # the API and tools that build engines: the CLI, the server, `lanes distill`
    ("api", ["lanes", "lanes.cli", "lanes.serve_options", "lanes.server", "lanes.openai_api",
             "lanes.async_engine", "lanes.drafter.distill", "lanes.utility_api",
             "lanes.server_metrics", "lanes.tools", "lanes.http_protocol", "lanes.responses",
             "lanes.serve_command", "lanes.vllm_flags", "lanes.vllm_fields", "lanes.prompt_scores",
             "lanes.response_fields", "lanes.responses_api", "lanes.reasoning",
             "lanes.request_models", "lanes.tool_formats"]),
    ("build", ["lanes.build", "lanes.warmup"]),  # the composition root
    ("engine", ["lanes.engine"]),  # the thin loop
    ("engine: rounds in a step's place", ["lanes.overlap", "lanes.device_round_driver"]),
    ("engine: round execution", ["lanes.round_execution"]),
    ("engine: isolation, scoring", ["lanes.isolation", "lanes.scoring"]),
    ("engine: output", ["lanes.output"]),
    ("engine: drafting, verifying", ["lanes.drafting", "lanes.verifier"]),
    ("engine: scheduler, intake", ["lanes.scheduler", "lanes.intake"]),
    ("engine: state", ["lanes.share", "lanes.prompt_burst", "lanes.metrics", "lanes.inflight", "lanes.draft_costs",
                       "lanes.recurrent", "lanes.launched_chunks", "lanes.round_clock",
                       "lanes.round_book", "lanes.mask_budget", "lanes.mask_prefetch"]),
    ("drafter", ["lanes.drafter"]),
    ("runner", ["lanes.runner", "lanes.graphs", "lanes.mixed_graphs", "lanes.chain_graphs",
                "lanes.device_rounds",
                "lanes.device_round_trees",
                "lanes.parallel", "lanes.block_tables", "lanes.branch_scratch",
                "lanes.device_sampling", "lanes.speculation"]),
    ("models", ["lanes.models"]),
    ("ops", ["lanes.backends", "lanes.ops", "lanes.triton_ops", "lanes.attention"]),
    ("kernels", ["lanes.kernels"]),
    # below all of them: memory, the round plan, requests, config (DESIGN.md)
    ("base", ["lanes.cache", "lanes.rounds", "lanes.lane", "lanes.lane_rows", "lanes.lane_view",
              "lanes.sampling", "lanes.sample_math", "lanes.penalties", "lanes.grammar",
              "lanes.grammar_spec", "lanes.grammar_limits", "lanes.deep_stack",
              "lanes.prompt_bounds", "lanes.config", "lanes.family_fields", "lanes.batch",
              "lanes.tokenizer", "lanes.chat", "lanes.detokenize", "lanes.packed", "lanes._source_tree"]),
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
    upward = _upward(mods, mods)
    assert not upward, "\n".join(upward)


def _layer_of(name: str) -> str:
    return LAYERS[_layer(name)][0]


def _upward(mods: dict[str, Path], paths: dict[str, Path]) -> list[str]:
    return [
        f"{name} ({_layer_of(name)}) imports {target} ({_layer_of(target)})"
        for name, path in paths.items()
        for target in _imports(path, mods) - {name}
        if _layer(target) < _layer(name)
    ]


def test_negative_control_an_upward_import_is_found(tmp_path):
    """A drafter reaching into the engine's parts (what drafters did before issue 40)."""
    mods = _modules()
    leaky = tmp_path / "ngram.py"
    leaky.write_text(
        mods["lanes.drafter.ngram"].read_text() + "\nfrom lanes.output import Output\n"
    )
    found = _upward(mods, {"lanes.drafter.ngram": leaky})
    assert found == ["lanes.drafter.ngram (drafter) imports lanes.output (engine: output)"]


# Below the engine everything takes plain data: drafters get lane views and chunks
# (lanes/lane_view.py), the runner and kernels LaneRows, tensors and numbers. None of them
# reads the scheduler's lanes or steps, the engine's metrics or its grammar matchers.
PLAIN_DATA_SIDE = ["lanes.drafter", "lanes.runner", "lanes.graphs", "lanes.chain_graphs",
                   "lanes.device_rounds", "lanes.device_round_trees", "lanes.parallel", "lanes.block_tables",
                   "lanes.branch_scratch", "lanes.device_sampling", "lanes.speculation", "lanes.batch", "lanes.models",
                   "lanes.backends", "lanes.ops", "lanes.triton_ops", "lanes.attention",
                   "lanes.kernels"]  # fmt: skip
ENGINE_TYPES = {"lanes.lane", "lanes.rounds", "lanes.metrics", "lanes.grammar", "lanes.engine"}


def _engine_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    return {t for t in _imports(path, mods) if t in ENGINE_TYPES or t.rsplit(".", 1)[0] in
            ENGINE_TYPES}  # fmt: skip


def _plain_data_side(mods: dict[str, Path]) -> dict[str, Path]:
    return {
        m: p
        for m, p in mods.items()
        if any(m == s or m.startswith(s + ".") for s in PLAIN_DATA_SIDE)
        and m != "lanes.drafter.distill"  # the `lanes distill` command: the API layer
    }


def test_below_the_engine_only_plain_data():
    mods = _modules()
    leaks = {m: _engine_imports(p, mods) for m, p in _plain_data_side(mods).items()}
    assert not any(leaks.values()), {m: v for m, v in leaks.items() if v}


def test_negative_control_a_lane_import_in_a_drafter_is_found(tmp_path):
    mods = _modules()
    leaky = tmp_path / "eagle.py"
    leaky.write_text(mods["lanes.drafter.eagle"].read_text() + "\nfrom lanes.lane import Lane\n")
    assert _engine_imports(leaky, mods) == {"lanes.lane"}


# Kernels take tensors and plain numbers: besides each other they read only packed weights'
# containers, the position-keyed sampling math their references check against, and the cache
# directory where the CPU kernels are built.
KERNEL_MAY_IMPORT = {"lanes.packed", "lanes.sample_math", "lanes.config"}


def _kernel_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    return {
        t for t in _imports(path, mods)
        if not t.startswith("lanes.kernels") and t not in KERNEL_MAY_IMPORT
    }  # fmt: skip


def test_kernels_take_plain_data():
    mods = _modules()
    leaks = {m: _kernel_imports(p, mods) for m, p in mods.items() if m.startswith("lanes.kernels")}
    assert not any(leaks.values()), {m: v for m, v in leaks.items() if v}


def test_negative_control_a_batch_import_in_a_kernel_is_found(tmp_path):
    mods = _modules()
    leaky = tmp_path / "attention_cpu.py"
    text = mods["lanes.kernels.attention_cpu"].read_text()
    leaky.write_text(text + "\nfrom lanes.batch import ForwardBatch\n")
    assert _kernel_imports(leaky, mods) == {"lanes.batch"}


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


# A file that grows past this holds more than one concept (issue 40: engine.py had reached 1,301
# lines); split it by job instead. Runtime code only: tests and benches are not installed.
MAX_LINES = 600


def _too_long(paths: dict[str, Path]) -> dict[str, int]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in paths.items()}
    return {name: n for name, n in lengths.items() if n > MAX_LINES}


def test_no_runtime_file_over_600_lines():
    assert not _too_long(_modules())


def test_negative_control_a_long_file_is_found(tmp_path):
    long = tmp_path / "engine.py"
    long.write_text("\n".join(f"x{i} = {i}" for i in range(MAX_LINES + 1)))
    assert _too_long({"lanes.engine": long}) == {"lanes.engine": MAX_LINES + 1}
