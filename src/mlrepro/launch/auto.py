"""The one place a backend is chosen: a seed's attempt (local or Slurm, as one job or a chain of
time-limited segments) and a stage's job array (parallel here or one Slurm array), by the system's
scheduler, as submitit's AutoExecutor chooses."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from mlrepro.config import System
from mlrepro.launch import array, chain
from mlrepro.launch.job import SeedPlan
from mlrepro.launch.local import run_seed_local
from mlrepro.launch.slurm import run_seed_slurm


def backend(system_or_plan) -> Callable[[SeedPlan, System, Path], None]:
    """The function that runs one attempt of a seed on the scheduler of a plan (or system)."""
    return run_seed_slurm if system_or_plan.scheduler == "slurm" else run_seed_local


def run_seed(plan: SeedPlan, system: System, run_log: Path) -> None:
    """Run one attempt of the seed on the backend of the plan's scheduler."""
    backend(plan)(plan, system, run_log)


def run_seed_attempts(plan: SeedPlan, system: System, run_log: Path, limits: chain.Limits | None, retries: int,
                      finish: Callable[[], None]) -> dict:
    """The seed's attempts on the plan's scheduler, as one job or, for a checkpointing benchmark (limits
    given), as a chain of segments, under the one attempt policy (mlrepro.launch.chain.run_seed)."""
    return chain.run_seed(plan, system, run_log, run_seed, limits, retries, finish)


def run_array(plan: array.ArrayPlan, spec: dict, root: Path, system: System | None, todo_of: Callable[[], list[int]],
              done: Callable[[int], bool], task: Callable[[int], None], parallel: int) -> list[int]:
    """The stage's tasks still to do (`todo_of()`, asked once an earlier array of the stage is over): ONE
    Slurm array on a Slurm system, else `parallel` at a time here. Returns the indices it ran."""
    slurm = system is not None and system.scheduler == "slurm"
    if slurm:
        array.wait_for_earlier(plan, system.slurm_status_command, system.slurm_poll_seconds)
    todo = todo_of()
    if slurm:
        array.run_slurm(plan, spec, root, todo, done, system.partition, system.account)
    else:
        array.run_local(plan, todo, task, parallel)
    return todo
