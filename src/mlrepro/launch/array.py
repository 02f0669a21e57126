"""Many independent tasks of one stage (a corpus's download shares, its preprocess chunks) as ONE Slurm
job array, or in parallel on this machine; mlrepro.launch.auto chooses.

On a Slurm system the stage's one Snakemake job submits ONE `sbatch --array=<indices> --wait`:
task i reads its index from SLURM_ARRAY_TASK_ID (a download task's RANK, WORLD_SIZE = the
number of tasks, as the NeMo guide's download.py; a preprocess task's chunk) and runs the plan's
`python -m <task_module> <stage> --spec ... --index $RANK` (a corpus's: mlrepro.corpus.tasks).
Only indices whose output is missing are submitted, so a
rerun after a failed or cancelled task redoes that task alone. When sbatch returns, every
submitted index must have its output; the ones that do not are named with their logs.
Without Slurm the same tasks run in threads on this machine.

If the workflow died while an array ran (Slurm keeps running it), the rerun first waits for that
array's live tasks, found by the job name, so that no chunk ever has two writers.

Why not the executor plugin's own array mode (`--slurm-array-jobs`, in the pinned 2.8.0): its
array index picks a Snakemake job, not the seed's RANK (1-based, WORLD_SIZE unknown to the task),
every task then starts a whole Snakemake (parsing the workflow) for a few lines of work, the
plan (`snakemake -n`) shows no array, and the plugin cancels its jobs when Snakemake dies.
"""

from __future__ import annotations

import hashlib
import logging
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mlrepro.slurm import client as slurm
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

SBATCH_TIMEOUT_S = 7 * 24 * 3600  # --wait lasts as long as the array; Slurm's own time limits end it sooner


class ArrayError(RuntimeError):
    """Array tasks ended without their outputs."""


@dataclass(frozen=True)
class ArrayPlan:
    """One stage's array: whose (a corpus), which stage, how many tasks, what each runs, where things go."""

    name: str             # whose tasks: the corpus
    stage: str            # e.g. "download" or "preprocess"
    size: int             # WORLD_SIZE: indices 0..size-1
    folder: Path          # the owner's folder (resources/corpora/NAME): slurm/ holds the script and spec
    cpus: int = 1
    mem_mb: int | None = None
    task_module: str = ""  # `python -m task_module stage --spec F --root R --index I` runs one task
    family: str = "corpus"  # names the job (mlrepro-<family>-<name>-<stage>-<hash>) and the spec file
    log_folder: str = "logs/corpora"  # under the root; each task logs to <log_folder>/<name>/<stage>_task_<i>.log

    @property
    def job_name(self) -> str:
        # The folder's hash tells apart two checkouts preparing the same corpus on one cluster.
        where = hashlib.sha1(str(self.folder.resolve()).encode()).hexdigest()[:8]
        return f"mlrepro-{self.family}-{self.name}-{self.stage}-{where}"

    @property
    def script(self) -> Path:
        return self.folder / "slurm" / f"{self.stage}.sbatch"

    @property
    def spec(self) -> Path:
        return self.folder / "slurm" / f"{self.family}.json"

    def log_pattern(self, root: Path) -> str:
        return str(root / self.log_folder / self.name / f"{self.stage}_task_%a.log")


def indices_text(indices: list[int]) -> str:
    """Slurm's --array syntax, contiguous runs folded (0-15, or 3,7-9)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def sbatch_request(plan: ArrayPlan, indices: list[int], root: Path, partition: str | None,
                   account: str | None) -> slurm.SbatchRequest:
    extra = [f"--array={indices_text(indices)}", "--wait", f"--cpus-per-task={plan.cpus}"]
    if plan.mem_mb:
        extra.append(f"--mem={plan.mem_mb}M")
    return slurm.SbatchRequest(script=plan.script, partition=partition, account=account, job_name=plan.job_name,
                               output=plan.log_pattern(root), workdir=root, extra_args=extra)


def describe(plan: ArrayPlan, root: Path, partition: str | None, account: str | None) -> str:
    """The plan line `snakemake -n` shows."""
    return (f"{plan.name}: {plan.stage} as one Slurm job array of {plan.size} tasks "
            f"(RANK=$SLURM_ARRAY_TASK_ID, WORLD_SIZE={plan.size}): "
            + " ".join(sbatch_request(plan, list(range(plan.size)), root, partition, account).render()))


def write_script(plan: ArrayPlan, spec: dict, root: Path) -> None:
    """The batch script and the resolved description (`spec`, e.g. the corpus) every task reads."""
    atomic_write_json(plan.spec, spec)
    command = [sys.executable, "-m", plan.task_module, plan.stage, "--spec", str(plan.spec.resolve()),
               "--root", str(root.resolve())]
    atomic_write_text(plan.script, "\n".join([
        "#!/bin/bash",
        f"# mlrepro {plan.family} {plan.name}: {plan.stage}, one array task per index (see mlrepro.launch.array)",
        "set -euo pipefail",
        f"export RANK=$SLURM_ARRAY_TASK_ID WORLD_SIZE={plan.size}",
        " ".join(map(shlex.quote, command)) + ' --index "$RANK"',
        "",
    ]))
    plan.script.chmod(0o700)


def wait_for_earlier(plan: ArrayPlan, status_command: str = "sacct", poll_seconds: float = 5.0) -> None:
    """Wait while an array of this stage from an earlier run is still queued or running."""
    while live := [j.job_id for j in slurm.find_jobs(plan.job_name, status_command=status_command) if not j.terminal]:
        log.info("an earlier %s array is still in Slurm (%s); waiting for it", plan.stage, ", ".join(live[:5]))
        time.sleep(poll_seconds)


def run_slurm(plan: ArrayPlan, spec: dict, root: Path, indices: list[int], done: Callable[[int], bool],
              partition: str | None = None, account: str | None = None) -> None:
    """Submit `indices` as one array, wait for it, and check every task's output."""
    if not indices:
        log.info("%s %s: every task's output is there; nothing submitted", plan.name, plan.stage)
        return
    write_script(plan, spec, root)
    Path(plan.log_pattern(root)).parent.mkdir(parents=True, exist_ok=True)
    request = sbatch_request(plan, indices, root, partition, account)
    log.info("submitting %d array task(s): %s", len(indices), " ".join(request.render()))
    try:
        proc = slurm.run_waiting(request, timeout=SBATCH_TIMEOUT_S)
    except slurm.SlurmError as exc:
        raise ArrayError(str(exc)) from None
    job_id = proc.stdout.strip().splitlines()[0].split(";")[0] if proc.stdout.strip() else "?"
    log.info("Slurm array job %s ended (sbatch exit %d)", job_id, proc.returncode)
    check_outputs(plan, root, indices, done, job_id, proc.stderr.strip())


def check_outputs(plan: ArrayPlan, root: Path, indices: list[int], done: Callable[[int], bool], job_id: str, stderr: str) -> None:
    failed = [i for i in indices if not done(i)]
    if failed:
        logs = ", ".join(plan.log_pattern(root).replace("%a", str(i)) for i in failed[:5])
        raise ArrayError(f"{plan.name} {plan.stage}: array job {job_id}: task(s) {indices_text(failed)} of "
                         f"{plan.size} ended without their output; see {logs}" + (f" ({stderr})" if stderr else ""))


def run_local(plan: ArrayPlan, indices: list[int], task: Callable[[int], None], parallel: int) -> None:
    """The same tasks on this machine, `parallel` at a time; every failure is reported."""
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(indices) or 1))) as pool:
        for i, fut in [(i, pool.submit(task, i)) for i in indices]:
            try:
                fut.result()
            except Exception as exc:  # reported together below, naming the task
                errors.append(f"task {i}: {exc}")
    if errors:
        raise ArrayError(f"{plan.name} {plan.stage}: {len(errors)} task(s) failed:\n  " + "\n  ".join(errors))
