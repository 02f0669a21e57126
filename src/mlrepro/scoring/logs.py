"""The logs `mlrepro score` and the reference scorer are given: files, or folders searched for them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from mlrepro.paths import SeedPaths
from mlrepro.scoring import megatron_log
from mlrepro.scoring.mllog import contains_mllog

_LOG_SUFFIXES = {".txt", ".log", ".out", ".err", ""}


def collect_logs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """The log files named by `paths` (files, or folders searched recursively).

    In a folder holding result_*.txt (an MLPerf package) only those are taken;
    in one holding our mllog.txt only that one (the raw log beside it is the
    same run); otherwise every file with MLLOG lines.
    """
    files: list[Path] = []
    notes: list[str] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = _logs_in_dir(p)
            if not found:
                notes.append(f"no MLLOG logs in {p}")
            files.extend(found)
        elif p.exists():
            notes.append(f"{p} is not a regular file or folder; skipped")
        else:
            notes.append(f"{p} does not exist")
    unique, seen = [], set()
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, notes


def _logs_in_dir(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        names = sorted(n for n in filenames if not n.startswith("."))
        # result_summarizer's glob (result_*.txt, whatever the middle); the folders below a benchmark
        # folder hold its power logs (power/result_*/node_*.txt), not runs.
        results = [n for n in names if n.startswith("result_") and n.endswith(".txt")]
        if results:
            dirnames[:] = []
            chosen = sorted(results, key=lambda n: (len(n), n))
        elif SeedPaths.MLLOG in names:  # a seed folder: its mllog.txt alone (run.log beside it holds the same lines)
            chosen = [SeedPaths.MLLOG]
        else:
            chosen = [n for n in names if Path(n).suffix.lower() in _LOG_SUFFIXES]
        out.extend(Path(dirpath) / n for n in chosen
                   if contains_mllog(Path(dirpath) / n) or megatron_log.is_training_log(Path(dirpath) / n))
    return out
