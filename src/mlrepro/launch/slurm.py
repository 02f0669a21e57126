"""The Slurm backend: one seed's run.sub submitted with the plan's sbatch line, re-attached after a restart, collected."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from mlrepro import paths
from mlrepro.config import System
from mlrepro.launch.job import (
    SeedFailed,
    SeedPlan,
    io_failure,
    now,
    record_failure,
    run_env,
)
from mlrepro.util import secrets
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)


# States after which a node is suspected: the seed's retry avoids the nodes it ran on.
NODE_SUSPECT_STATES = {"NODE_FAIL", "FAILED", "OUT_OF_MEMORY"}


def _container_image(plan: SeedPlan) -> str:
    """What run.sub gets as CONT: the .sqsh, the pushed or built image, or `none` to run on the host."""
    root = plan.seed_dir.parents[2]  # seed_dir is <root>/results/<benchmark>/seed_<N> (paths.seed_dir)
    record = paths.read_container(root, plan.benchmark)
    return paths.container_image(record, pushed=True) or "none"


def _submit(plan: SeedPlan, system: System, attempt: int) -> dict:
    from mlrepro.slurm import client as slurm

    seed_dir = plan.seed_dir
    logdir = seed_dir / f"attempt_{attempt}"
    logdir.mkdir(parents=True, exist_ok=True)
    suspects = sorted(set((paths.read_failure(seed_dir) or {}).get("suspect_nodes", [])))
    env = run_env(plan, logdir, CONT=_container_image(plan))
    exclude = tuple(system.exclude_nodes) + tuple(n for n in suspects if n not in system.exclude_nodes)
    command = slurm.for_attempt(plan.sbatch, exclude=exclude, output=logdir / "slurm-%j.out", workdir=logdir)
    try:
        job_id = slurm.submit_command(command, env=env, job_name=plan.job_name)
    except slurm.SlurmError as exc:
        if not suspects:
            raise
        # Too few nodes left without the suspects: run anyway rather than never.
        log.warning("seed %d: cannot exclude %s (%s); submitting without", plan.seed, ",".join(suspects), exc)
        exclude = tuple(system.exclude_nodes)
        command = slurm.for_attempt(plan.sbatch, exclude=exclude, output=logdir / "slurm-%j.out", workdir=logdir)
        job_id = slurm.submit_command(command, env=env, job_name=plan.job_name)
    job = {
        "scheduler": "slurm",
        "job_id": job_id,
        "attempt": attempt,
        "logdir": str(logdir),
        "exclude": list(exclude),
        "sbatch": command,
        "submitted": now(),
    }
    atomic_write_json(seed_dir / "job.json", job)
    log.info("seed %d: submitted Slurm job %s (attempt %d)", plan.seed, job_id, attempt)
    return job


def _attach_or_submit(plan: SeedPlan, system: System) -> dict:
    """The seed's Slurm job to wait for: a live or finished-unread one from before, else a new one."""
    from mlrepro.slurm import client as slurm

    job = paths.read_job(plan.seed_dir)
    if job and job.get("scheduler") == "slurm":
        info = slurm.job_info(job["job_id"], status_command=system.slurm_status_command)
        # UNKNOWN: Slurm has forgotten the job (purged from accounting); it cannot be waited for.
        if info.state != "UNKNOWN" and (not slurm.is_terminal(info.state) or not job.get("collected")):
            log.info("seed %d: re-attaching to Slurm job %s (%s)", plan.seed, job["job_id"], info.state)
            return job
    # A job submitted just before the workflow died may not have reached job.json.
    for live in slurm.find_jobs(plan.job_name, status_command=system.slurm_status_command):
        if not live.terminal and (job is None or live.job_id != job.get("job_id")):
            log.info("seed %d: re-attaching to unrecorded Slurm job %s", plan.seed, live.job_id)
            attempt = (job or {}).get("attempt", 0) + 1
            logdir = plan.seed_dir / f"attempt_{attempt}"
            job = {"scheduler": "slurm", "job_id": live.job_id, "attempt": attempt, "logdir": str(logdir), "submitted": None}
            atomic_write_json(plan.seed_dir / "job.json", job)
            return job
    return _submit(plan, system, attempt=(job or {}).get("attempt", 0) + 1)


def run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    try:
        _run_seed_slurm(plan, system, run_log)
    except OSError as exc:
        io_failure(plan, exc)


def _run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    from mlrepro.slurm import client as slurm

    seed_dir = plan.seed_dir
    seed_dir.mkdir(parents=True, exist_ok=True)
    job = _attach_or_submit(plan, system)
    info = slurm.wait(job["job_id"], poll_seconds=system.slurm_poll_seconds, status_command=system.slurm_status_command)
    # The job's own logs are redacted in place as soon as it ends; run.log is made from them.
    for written in Path(job["logdir"]).glob("*"):
        if written.is_file() and written.suffix in (".log", ".out", ".txt"):
            with contextlib.suppress(OSError):
                secrets.redact_file(written)
    logs = sorted(Path(job["logdir"]).glob("*_1.log"))
    run_log.write_text("".join(p.read_text(errors="replace") for p in logs) if logs else "")
    atomic_write_json(
        seed_dir / "job.json",
        {**job, "collected": now(), "state": info.state, "end": info.end, "elapsed_s": info.elapsed_seconds,
         "nodes": list(info.nodes)},
    )
    if info.state != "COMPLETED":
        previous = (paths.read_failure(seed_dir) or {}).get("suspect_nodes", [])
        suspects = sorted(set(previous) | (set(info.nodes) if info.state in NODE_SUSPECT_STATES else set()))
        record_failure(
            seed_dir, f"Slurm job {job['job_id']} ended {info.state}" + (f" (exit code {info.exit_code})" if info.exit_code else ""),
            state=info.state, exit_code=info.exit_code, job_id=job["job_id"], nodes=list(info.nodes),
            suspect_nodes=suspects, attempt=job["attempt"],
        )
        raise SeedFailed(
            f"seed {plan.seed}: Slurm job {job['job_id']} ended {info.state}; see {job['logdir']}",
            retry=info.state != "CANCELLED",
        )
    if not logs:
        record_failure(seed_dir, f"Slurm job {job['job_id']} wrote no run log in {job['logdir']}", state="NO_LOG", job_id=job["job_id"])
        raise SeedFailed(f"seed {plan.seed}: no run log in {job['logdir']}")

