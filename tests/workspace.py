"""A throwaway copy of the workflow to run the real snakemake in, for integration tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COPIED = ("Snakefile", "workflow", "config", "profiles", "implementations")


def make_workspace(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", *args]


def run_snakemake(workdir: Path, *args: str, timeout: float = 1800, check: bool = True,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        snakemake_cmd(*args), cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def planned_jobs(output: str) -> dict[str, int]:
    """The job counts table that `snakemake -n` prints (rule -> count)."""
    counts: dict[str, int] = {}
    in_table = False
    for line in output.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            in_table = True
            continue
        if in_table:
            if len(parts) == 2 and parts[1].isdigit():
                if parts[0] != "total":
                    counts[parts[0]] = int(parts[1])
            elif parts and not set(line.strip()) <= {"-", " "}:
                in_table = False
    return counts


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    """predicate()'s first truthy value within `timeout` s; fails the test if `proc` (snakemake) ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"snakemake ended ({proc.returncode}) before {what}:\n{proc.stdout.read()[-5000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")
