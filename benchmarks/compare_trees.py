"""Two source trees of mlrepro side by side: the miniature end to end and the scoring of a results round.

    python benchmarks/compare_trees.py --before DIR --after DIR [--rounds 1] [--tree /work/data/v5.0]
                                       [--target results/mini_lora/score.json] [--skip-mini]

DIR is a checkout (or `git archive` export) of each tree. Both run with this interpreter (the
project's venv) and PYTHONPATH pointing at the tree's src/, so only the code differs. The runs
alternate (before, after, before, after, ...) so that a machine that gets busier or quieter
weighs on both alike.

- mini: a fresh copy of the tree (no results/, resources/, logs/, .snakemake/), then
  `python -m snakemake --profile profiles/local TARGET`, timed to its end; the run must end with
  exit status 0 and the target present.
- score: `python -m mlrepro score TREE --csv FILE` over a whole results round (tree mode), and the
  per-folder mode over each of its benchmark folders (`mlrepro score DIR --benchmark B`), timed.

Prints one table: the median seconds of each tree and after/before.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKIP = {"results", "resources", "logs", ".snakemake", ".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis"}


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names if n in SKIP])
    return dest


def env_for(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} in {cwd} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds


def run_mini(tree: Path, target: str) -> float:
    with tempfile.TemporaryDirectory(prefix="mlrepro-mini-") as tmp:
        work = copy_tree(tree, Path(tmp) / "tree")
        seconds = timed([sys.executable, "-m", "snakemake", "--profile", "profiles/local", target], work, env_for(work))
        if not (work / target).exists():
            sys.exit(f"{tree}: the run ended without {target}")
        return seconds


def benchmark_folders(round_dir: Path) -> list[tuple[Path, str]]:
    """(folder, benchmark) of every <submitter>/results/<system>/<benchmark>/ holding result logs."""
    return [(b, b.name) for b in sorted(round_dir.glob("*/results/*/*"))
            if b.is_dir() and any(b.glob("result_*.txt"))]


def run_tree_score(tree: Path, round_dir: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="mlrepro-score-") as tmp:
        return timed([sys.executable, "-m", "mlrepro", "score", str(round_dir), "--csv", str(Path(tmp) / "round.csv")],
                     Path(tmp), env_for(tree))


def run_folder_scores(tree: Path, folders: list[tuple[Path, str]]) -> float:
    """Every folder in one process per folder, as a user scoring them one at a time would; a folder the
    tree refuses (exit status 1: not valid) counts its time like any other."""
    env = env_for(tree)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlrepro-score-") as tmp:
        for folder, benchmark in folders:
            subprocess.run([sys.executable, "-m", "mlrepro", "score", str(folder), "--benchmark", benchmark],
                           cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", type=Path, help="a results round (the folder holding the submitters)")
    parser.add_argument("--target", default="results/mini_lora/score.json")
    parser.add_argument("--skip-mini", action="store_true")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    folders = benchmark_folders(args.tree) if args.tree else []
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name, tree in trees.items():
            measured = {}
            if not args.skip_mini:
                measured["miniature end to end"] = run_mini(tree, args.target)
            if args.tree:
                measured["score round (tree mode)"] = run_tree_score(tree, args.tree)
                measured[f"score {len(folders)} folders (per-folder)"] = run_folder_scores(tree, folders)
            for what, seconds in measured.items():
                times.setdefault((what, name), []).append(seconds)
                print(f"round {r + 1} {name:6s} {what}: {seconds:.1f} s", flush=True)
    print("\n| measurement | before (s) | after (s) | after/before |\n|---|---|---|---|")
    for what in dict.fromkeys(w for w, _ in times):
        b, a = statistics.median(times[(what, "before")]), statistics.median(times[(what, "after")])
        print(f"| {what} | {b:.1f} | {a:.1f} | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
