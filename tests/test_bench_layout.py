"""bench/ by question: `python -m bench.<question> <subcommand>` finds every benchmark, and a
benchmark script added beside them at the top level is caught."""

from __future__ import annotations

import ast
from pathlib import Path

from bench.dispatch import QUESTIONS, run, subcommands

BENCH = Path(__file__).resolve().parent.parent / "bench"
# the top level keeps the exactness harness, shared helpers and result tools only
TOP_LEVEL = {"__init__", "__main__", "dispatch", "exactness", "compare", "plots", "shapes",
             "random_checkpoint", "stats"}  # fmt: skip


def _stray_scripts(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py")} - TOP_LEVEL


def test_every_question_folder_is_a_question_and_has_subcommands():
    folders = {p.name for p in BENCH.iterdir() if (p / "__main__.py").exists()}
    assert folders == set(QUESTIONS)
    for question in QUESTIONS:
        subs = subcommands(question)
        assert subs and all(subs.values()), (question, subs)  # each says what it answers
        for name in subs:
            path = BENCH / question / f"{name.replace('-', '_')}.py"
            ast.parse(path.read_text())


def test_no_stray_scripts_at_the_top_level():
    assert not _stray_scripts(BENCH)


def test_negative_control_a_stray_script_is_found(tmp_path):
    for name in TOP_LEVEL | {"bench_new_idea"}:
        (tmp_path / f"{name}.py").write_text("")
    assert _stray_scripts(tmp_path) == {"bench_new_idea"}


def test_an_unknown_subcommand_is_refused(capsys):
    assert run("speed", ["no-such-benchmark"]) == 2
    assert "no subcommand 'no-such-benchmark'" in capsys.readouterr().err
