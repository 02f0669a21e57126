"""The Slurm backend: one seed's run.sub submitted with the plan's sbatch line, re-attached after a restart, collected."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from pathlib import Path

from mlrepro import paths
from mlrepro.config import System
from mlrepro.launch import attempt as attempt_policy
from mlrepro.launch.job import (
    Diverged,
    EarlyStopped,
    SeedFailed,
    SeedPlan,
    diverged,
    early_stop_settled,
    io_failure,
    now,
    record_attempt,
    record_failure,
    run_env,
    write_job,
)
from mlrepro.paths import AttemptPaths, JobRecord
from mlrepro.preflight import quick
from mlrepro.slurm import client as slurm
from mlrepro.slurm import node_health
from mlrepro.util import secrets

log = logging.getLogger(__name__)


HUNG = "hung: "

# States after which a node is suspected: the seed's retry avoids the nodes it ran on.
NODE_SUSPECT_STATES = {"NODE_FAIL", "FAILED", "OUT_OF_MEMORY"}


def _container_image(plan: SeedPlan) -> str:
    """What run.sub gets as CONT: the .sqsh, the pushed or built image, or `none` to run on the host."""
    record = paths.read_container(plan.files.root, plan.benchmark)
    return paths.container_image(record, pushed=True) or "none"


def bad_nodes_file(plan: SeedPlan, system: System) -> Path:
    return node_health.bad_nodes_file(plan.files.root, system.name)


def _submit(plan: SeedPlan, system: System, attempt: int) -> JobRecord:
    seed_dir = plan.seed_dir
    here = plan.files.attempt(attempt)
    logdir = here.folder
    logdir.mkdir(parents=True, exist_ok=True)
    suspects = sorted(set((paths.read_failure(seed_dir) or {}).get("suspect_nodes", [])))
    # srun runs the quick preflight on each node before its first rank (run.sub itself stays NVIDIA's).
    env = run_env(plan, logdir, CONT=_container_image(plan),
                  SLURM_TASK_PROLOG=str(quick.task_prolog(logdir, sys.executable)))
    # The nodes found bad by any earlier seed of the reproduction, then this seed's own suspects.
    base = node_health.exclude_list(system.exclude_nodes, bad_nodes_file(plan, system))
    exclude = base + tuple(n for n in suspects if n not in base)
    request = dataclasses.replace(plan.sbatch, exclude=exclude, output=here.slurm_output, workdir=logdir)
    try:
        job_id = slurm.submit_request(request, env=env)
    except slurm.SlurmError as exc:
        if tuple(exclude) == tuple(system.exclude_nodes):
            raise
        # Too few nodes left without the suspects: run anyway rather than never.
        log.warning("seed %d: cannot exclude %s (%s); submitting without", plan.seed,
                    ",".join(n for n in exclude if n not in system.exclude_nodes), exc)
        exclude = tuple(system.exclude_nodes)
        request = dataclasses.replace(request, exclude=exclude)
        job_id = slurm.submit_request(request, env=env)
    job = JobRecord(scheduler="slurm", job_id=job_id, attempt=attempt, logdir=logdir, exclude=tuple(exclude),
                    sbatch=tuple(request.render()), submitted=now())
    write_job(seed_dir, job)
    log.info("seed %d: submitted Slurm job %s (attempt %d)", plan.seed, job_id, attempt)
    return job


def _attach_or_submit(plan: SeedPlan, system: System) -> tuple[JobRecord, bool]:
    """The seed's Slurm job to wait for: a live or finished-unread one from before, else a new one;
    and whether it had ended before this invocation looked (then a scancel of it was made while an
    earlier invocation ran, and running the workflow again is what runs the seed again)."""
    job = paths.read_job(plan.seed_dir)
    if job is not None and job.scheduler == "slurm":
        info = slurm.job_info(job.job_id, status_command=system.slurm_status_command)
        # UNKNOWN: Slurm has forgotten the job (purged from accounting); it cannot be waited for.
        if info.state != "UNKNOWN" and (not slurm.is_terminal(info.state) or not job.collected):
            log.info("seed %d: re-attaching to Slurm job %s (%s)", plan.seed, job.job_id, info.state)
            return job, slurm.is_terminal(info.state)
    attempt = (job.attempt if job is not None and job.attempt else 0) + 1
    # A job submitted just before the workflow died may not have reached job.json.
    for live in slurm.find_jobs(plan.job_name, status_command=system.slurm_status_command):
        if not live.terminal and (job is None or live.job_id != job.job_id):
            log.info("seed %d: re-attaching to unrecorded Slurm job %s", plan.seed, live.job_id)
            job = JobRecord(scheduler="slurm", job_id=live.job_id, attempt=attempt,
                            logdir=plan.files.attempt(attempt).folder, submitted=None)
            write_job(plan.seed_dir, job)
            return job, False
    return _submit(plan, system, attempt=attempt), False


def run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    try:
        _run_seed_slurm(plan, system, run_log)
    except OSError as exc:
        io_failure(plan, exc)


def _run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    seed_dir = plan.seed_dir
    seed_dir.mkdir(parents=True, exist_ok=True)
    job, ended_before = _attach_or_submit(plan, system)
    here = AttemptPaths(job.logdir)
    here.folder.mkdir(parents=True, exist_ok=True)
    record_attempt(here.folder, job.attempt, "slurm", nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
                   start=job.submitted, job_id=job.job_id, state="PENDING", device=system.device)
    stopped = []
    rule = attempt_policy.HangRule.of(plan.hang)
    watches: list[attempt_policy.HangWatch] = []
    injection = attempt_policy.Injection.of(plan.inject_failures)
    kill_after = injection.kill_after(plan.seed, job.attempt) if injection else None
    running_since: list[float] = []

    def started(info) -> None:
        # The hang watch and the failure injection count from the job's start, not from its
        # submission: a queue is no hang, and a job that is not running cannot fail.
        if info.state == "RUNNING" and not running_since:
            running_since.append(time.monotonic())
        if rule is not None and info.state == "RUNNING" and not watches:
            watches.append(attempt_policy.HangWatch(rule, here.logs))

    def settled() -> bool:
        if not stopped and early_stop_settled(plan):
            stopped.append("stopped")
        if not stopped and (gone := diverged(plan)):
            stopped.append(gone.get("reason") or "diverged")
        if not stopped and watches and (hung := watches[0].poll()):
            stopped.append(HUNG + hung)
        if (not stopped and kill_after is not None and running_since
                and (ran := time.monotonic() - running_since[0]) >= kill_after):
            stopped.append(injection.reason(ran))  # slurm.wait scancels the job
        return bool(stopped)

    info = slurm.wait(job.job_id, poll_seconds=system.slurm_poll_seconds, status_command=system.slurm_status_command,
                      stop=settled, on_state=started)
    _record_cost(plan, job, info, system.device)
    # The job's own logs are redacted in place as soon as it ends; run.log is made from them.
    for written in here.folder.glob("*"):
        if written.is_file() and written.suffix in (".log", ".out", ".txt"):
            with contextlib.suppress(OSError):
                secrets.redact_file(written)
    logs = here.run_sub_logs()
    run_log.write_text("".join(p.read_text(errors="replace") for p in logs) if logs else "")
    write_job(seed_dir, dataclasses.replace(job, collected=now(), state=info.state, end=info.end,
                                            elapsed_s=info.elapsed_seconds, nodes=tuple(info.nodes)))
    if stopped and stopped[0].startswith(attempt_policy.INJECTED) and info.state != "COMPLETED":
        record_failure(seed_dir, stopped[0], state=attempt_policy.INJECTED_STATE, job_id=job.job_id,
                       attempt=job.attempt, nodes=list(info.nodes))
        raise SeedFailed(f"seed {plan.seed}: Slurm job {job.job_id} {stopped[0]}")
    if stopped and stopped[0].startswith(HUNG) and info.state != "COMPLETED":
        record_failure(seed_dir, stopped[0], state="HUNG", job_id=job.job_id, attempt=job.attempt,
                       nodes=list(info.nodes), last_line=watches[0].last_line)
        raise SeedFailed(f"seed {plan.seed}: Slurm job {job.job_id} {stopped[0]}")
    if stopped and stopped[0] != "stopped" and info.state != "COMPLETED":
        record_failure(seed_dir, stopped[0], state="DIVERGED", job_id=job.job_id, attempt=job.attempt)
        raise Diverged(f"seed {plan.seed}: Slurm job {job.job_id} cancelled, {stopped[0]}")
    if stopped and info.state != "COMPLETED":
        record_failure(seed_dir, f"early stop: Slurm job {job.job_id} cancelled, the reproduction is settled",
                       state="STOPPED", job_id=job.job_id, attempt=job.attempt)
        raise EarlyStopped(f"seed {plan.seed}: Slurm job {job.job_id} cancelled by the early stop")
    bad = _bad_nodes(plan, system, job, info, run_log)
    if info.state != "COMPLETED" or bad:
        previous = (paths.read_failure(seed_dir) or {}).get("suspect_nodes", [])
        suspects = sorted(set(previous) | set(bad) | (set(info.nodes) if info.state in NODE_SUSPECT_STATES else set()))
        why = "; ".join(bad.values()) if bad else (
            f"Slurm job {job.job_id} ended {info.state}" + (f" (exit code {info.exit_code})" if info.exit_code else ""))
        record_failure(
            seed_dir, why, state="PREFLIGHT_FAILED" if bad and info.state != "NODE_FAIL" else info.state,
            exit_code=info.exit_code, job_id=job.job_id, nodes=list(info.nodes),
            suspect_nodes=suspects, attempt=job.attempt,
        )
        raise SeedFailed(
            f"seed {plan.seed}: Slurm job {job.job_id} ended {info.state}; see {job.logdir}",
            retry=info.state != "CANCELLED" or ended_before,
        )
    if not logs:
        record_failure(seed_dir, f"Slurm job {job.job_id} wrote no run log in {job.logdir}", state="NO_LOG", job_id=job.job_id)
        raise SeedFailed(f"seed {plan.seed}: no run log in {job.logdir}")


def _record_cost(plan: SeedPlan, job: JobRecord, info, device: str) -> None:
    """attempt.json from sacct's own record of the job (elapsed, nodes, state), what the cost adds up."""
    acct = slurm.accounting(job.job_id) if info.source != "sacct" else info
    acct = acct or info
    record_attempt(job.logdir, job.attempt, "slurm", nodes=len(acct.nodes) or plan.nodes,
                   gpus_per_node=plan.gpus_per_node, start=acct.start, end=acct.end,
                   elapsed_s=acct.elapsed_seconds, state=acct.state, job_id=str(job.job_id),
                   node_names=acct.nodes, energy_j=acct.energy_j, source=acct.source or "sacct", device=device,
                   submitted=acct.submit or job.submitted)



def _bad_nodes(plan: SeedPlan, system: System, job: JobRecord, info, run_log: Path) -> dict[str, str]:
    """The nodes this attempt found bad (its quick preflight, a node failure, a GPU error), each recorded
    for the whole reproduction so that every later seed excludes it."""
    found = dict(quick.failed_nodes(job.logdir))
    text = run_log.read_text(errors="replace") if run_log.is_file() else ""
    if info.state != "COMPLETED" and (why := node_health.node_side(info.state, text)) and not found:
        down = slurm.out_of_service(info.nodes) if info.state in node_health.NODE_STATES else None
        found = node_health.blamed(info.nodes, why, down)
    new = [node for node, why in found.items()
           if node_health.record(bad_nodes_file(plan, system), node, why, benchmark=plan.benchmark, seed=plan.seed,
                                 attempt=job.attempt, job_id=str(job.job_id),
                                 source="preflight" if "preflight" in why else "job")]
    for node in new:
        log.warning("seed %d: node %s is bad (%s); every later seed excludes it", plan.seed, node, found[node])
    if new:
        # Seeds queued already would still start on it: their pending jobs exclude it too.
        try:
            queued = slurm.exclude_from_pending(plan.files.results_dir, new)  # every benchmark's seeds
        except slurm.SlurmError as exc:
            log.warning("seed %d: the queued seeds could not be kept off %s: %s", plan.seed, ",".join(new), exc)
        else:
            if queued:
                log.warning("seed %d: queued Slurm job(s) %s now exclude %s", plan.seed, ",".join(queued), ",".join(new))
    return found
