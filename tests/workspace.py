"""A throwaway copy of the workflow to run the real snakemake in, for integration tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from mlrepro.container import image

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
COPIED = ("Snakefile", "workflow", "config", "profiles", "implementations")


# mini_lora's learning rate for the tests whose subject is the orchestration around its seeds (kills,
# reruns, Slurm, reports), not its convergence: the same trainer reaches the same target (0.925) in a
# third of the training (7 s instead of 21 s on two idle cores, measured). The miniature as shipped is
# what the README's commands, the early-stop tests and `make mini` run.
QUICK_LR = "0.004"


def make_workspace(dest: Path, *, quick: bool = False, data_from: Path | None = None) -> Path:
    """A copy of the workflow in `dest`; `quick`: mini_lora at QUICK_LR; `data_from`: a workspace
    whose mini_lora data stages ran (mini_lora_data in conftest.py), their outputs and Snakemake's
    records of them copied, so that the copy starts where that one's seeds would."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    if quick:
        bench = dest / "config" / "benchmarks" / "mini_lora.yaml"
        assert "\nenv:" not in bench.read_text(), "mini_lora.yaml has an env: of its own now; merge QUICK_LR into it"
        with bench.open("a") as fh:
            fh.write(f"env:\n  LR: \"{QUICK_LR}\"\n")
    if data_from is not None:
        shutil.copytree(data_from / "resources" / "mini_lora", dest / "resources" / "mini_lora", symlinks=True)
        shutil.copytree(data_from / ".snakemake" / "metadata", dest / ".snakemake" / "metadata", dirs_exist_ok=True)
    return dest


def prepare_mini_lora_data(dest: Path) -> Path:
    """A workspace whose mini_lora dataset and base checkpoint stages have run (the real stages)."""
    ws = make_workspace(dest)
    run_snakemake(ws, "--profile", "profiles/local", "resources/mini_lora/data/manifest.json",
                  "resources/mini_lora/checkpoint/manifest.json", timeout=900)
    return ws


@dataclass(frozen=True)
class PodmanStore:
    env: dict[str, str]  # the MLREPRO_PODMAN_* settings that mlrepro's container stage reads
    cmd: list[str]  # podman on this store


@contextlib.contextmanager
def podman_store(root: Path) -> Iterator[PodmanStore]:
    """A throw-away podman store (vfs driver) in `root`, reset and removed afterwards. Its runroot is
    not under root: podman refuses a runroot path over 50 characters, and pytest's are longer. It has
    its own libpod state too (--tmpdir): the tests' stores are used side by side, and one's reset would
    otherwise remove the state the others are building with (/run/libpod)."""
    state = Path(tempfile.mkdtemp(prefix="mlrepro-podman-"))
    env = {"MLREPRO_PODMAN_STORAGE_DRIVER": "vfs", "MLREPRO_PODMAN_ROOT": str(root),
           "MLREPRO_PODMAN_RUNROOT": str(state / "run"), "MLREPRO_PODMAN_TMPDIR": str(state / "tmp")}
    cmd = ["podman", *(arg for option, variable in image.PODMAN_SETTINGS for arg in (option, env[variable]))]
    try:
        yield PodmanStore(env, cmd)
    finally:
        subprocess.run([*cmd, "system", "reset", "--force"], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


def snakemake_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", *args]


def run_snakemake(workdir: Path, *args: str, timeout: float = 1800, check: bool = True,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(
            snakemake_cmd(*args), cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"snakemake {' '.join(args)} still running after {timeout:.0f} s\n"
                             + _hang_report(workdir, exc)) from None
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def _hang_report(workdir: Path, exc: subprocess.TimeoutExpired) -> str:
    """What a hung run left to read: its output's tail, its logs' tails, and Slurm's queue."""
    def text(data) -> str:
        return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")

    parts = [f"--- stdout (tail)\n{text(exc.stdout)[-3000:]}", f"--- stderr (tail)\n{text(exc.stderr)[-6000:]}"]
    logs = sorted((workdir / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)[-6:] \
        if (workdir / "logs").is_dir() else []
    parts += [f"--- {p.relative_to(workdir)} (tail)\n{p.read_text(errors='replace')[-1500:]}" for p in logs]
    for cmd in (["squeue", "-a", "-o", "%i %j %T %r %N"], ["sacct", "-X", "-S", "now-1hour", "-o", "JobID,JobName%40,State"]):
        if shutil.which(cmd[0]):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                parts.append(f"--- {' '.join(cmd)}\n{out.stdout[-3000:]}{out.stderr[-500:]}")
            except subprocess.TimeoutExpired:
                parts.append(f"--- {cmd[0]} did not answer in 30 s")
    return "\n".join(parts)


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
