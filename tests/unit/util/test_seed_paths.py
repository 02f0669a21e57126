"""mlrepro.paths.SeedPaths: the one owner of every file name of a seed's folder, and nobody else spells them."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from mlrepro import paths
from mlrepro.paths import AttemptPaths, SeedPaths

SRC = Path(paths.__file__).resolve().parent

# Each file of the contract in paths' docstring, by its property (the name the folder shows).
SEED_FILES = {
    "plan": "plan.json", "mllog": "mllog.txt", "run_log": "run.log", "run_json": "run.json", "job": "job.json",
    "failure": "failure.json", "failure_reserve": ".failure.reserve", "stopped": "stopped.json",
    "diverged": "diverged.json", "finished": "finished.json", "segments": "segments.json",
    "checkpoints": "checkpoints", "submitit": ".submitit", "megatron_launch": "launch.sh",
    "megatron_args": "megatron_args.txt", "tensorboard": "tensorboard",
}
ATTEMPT_FILES = {"record": "attempt.json", "run_log": "run.log", "pid_file": "run.pid", "submitit": ".submitit",
                 "slurm_output": "slurm-%j.out", "adopted_log": "adopted.log"}


def _properties(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if isinstance(value, property)}


def test_every_file_of_a_seed_is_a_property_of_its_folder(tmp_path):
    files = SeedPaths.of(tmp_path, "b", 3)
    assert files.folder == tmp_path / "results" / "b" / "seed_3" == paths.seed_dir(tmp_path, "b", 3)
    assert {name: getattr(files, name) for name in SEED_FILES} == {
        name: files.folder / file for name, file in SEED_FILES.items()}
    # the seed's scored curve lives outside its folder, under results/tensorboard/ (one tree for TensorBoard)
    assert files.scored_tensorboard == tmp_path / "results" / "tensorboard" / "b" / "seed_3"
    place = {"benchmark_dir", "results_dir", "root", "seed", "scored_tensorboard"}
    assert _properties(SeedPaths) == set(SEED_FILES) | place, "a new file of the seed: add it to SEED_FILES"
    attempt = files.attempt(2)
    assert attempt.folder == files.folder / "attempt_2" and attempt.number == 2
    assert {name: getattr(attempt, name) for name in ATTEMPT_FILES} == {
        name: attempt.folder / file for name, file in ATTEMPT_FILES.items()}
    assert _properties(AttemptPaths) == set(ATTEMPT_FILES) | {"number"}


def test_the_root_and_the_benchmark_come_from_the_folder(tmp_path):
    files = SeedPaths(tmp_path / "results" / "b" / "seed_12")
    assert (files.root, files.results_dir, files.benchmark_dir, files.seed) == (
        tmp_path, tmp_path / "results", tmp_path / "results" / "b", 12)
    assert SeedPaths.under(tmp_path / "results" / "b", 12) == files
    assert paths.benchmark_root(files.benchmark_dir) == tmp_path
    assert SeedPaths(tmp_path / "elsewhere").seed is None


def test_the_module_helpers_name_the_same_files(tmp_path):
    files = SeedPaths(tmp_path)
    assert paths.plan_file(tmp_path) == files.plan
    assert paths.stopped_file(tmp_path) == files.stopped
    assert paths.diverged_file(tmp_path) == files.diverged
    assert paths.finished_file(tmp_path) == files.finished
    assert paths.attempt_record(tmp_path / "attempt_1") == files.attempt(1).record


def test_attempts_are_the_numbered_folders_in_order(tmp_path):
    files = SeedPaths(tmp_path)
    assert files.attempts() == [] and files.next_attempt() == 1
    for name in ("attempt_2", "attempt_10", "attempt_1", "attempt_x"):
        (tmp_path / name).mkdir()
    (tmp_path / "attempt_11").write_text("a file, not an attempt")
    assert [a.number for a in files.attempts()] == [1, 2, 10]
    assert files.next_attempt() == 11


def test_the_newest_log_and_run_subs_logs_of_an_attempt(tmp_path):
    attempt = SeedPaths(tmp_path).attempt(1)
    attempt.folder.mkdir()
    assert attempt.newest_log() is None and attempt.run_sub_logs() == []
    first, second = attempt.folder / "261126_1.log", attempt.folder / "run.log"
    first.write_text("a")
    second.write_text("b")
    os.utime(first, (1, 1))
    assert attempt.newest_log() == second and attempt.run_sub_logs() == [first]


def _names() -> set[str]:
    files = [getattr(SeedPaths(Path("s")), name).name for name in SEED_FILES]
    files += [getattr(AttemptPaths(Path("s/attempt_1")), name).name for name in ATTEMPT_FILES]
    return set(files)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _spells(text: str, names: set[str]) -> bool:
    parts = text.replace("*", "/").split("/")
    return (any(part in names for part in parts) or any(part.startswith("attempt_") for part in parts)
            or text.endswith(("attempt_", "seed_")) or "_1.log" in text)


@pytest.mark.parametrize("module", sorted(p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
                                          if p.name != "paths.py" or p.parent != SRC))
def test_no_module_but_paths_spells_a_seed_file_name(module):
    """Strings only (docstrings and comments may name the files they describe)."""
    tree = ast.parse((SRC / module).read_text())
    skip, names = _docstrings(tree), _names()
    spelled = [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
               and _spells(node.value, names)]
    assert spelled == [], f"{module} spells a seed's file name; name it through mlrepro.paths.SeedPaths"
