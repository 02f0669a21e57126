"""Launch one seed's training run the way the implementation's run.sub would.

A seed is one run of the implementation: run_and_time.sh with the environment that
config_<SYS>.sh exports plus DATADIR, MODEL, LOGDIR and SEED. On a `local` system it runs
through submitit's LocalExecutor (timeout = the config's wall-time); on a `slurm` system
run.sub itself is the batch script, submitted once per seed with sbatch.

Seed folder contract (results/<benchmark>/seed_<seed>/):
  mllog.txt     the run's MLLOG lines; written last, atomically: its presence means "done"
  run.log       the run's full output (the rule's log)
  job.json      the launch of the current attempt (local pid or Slurm job id)
  failure.json  why the last attempt failed; removed when an attempt succeeds
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlrepro import implementation, mllog
from mlrepro.config import RUN_ENV_PLACEHOLDERS, Benchmark, ConfigError, Settings, System
from mlrepro.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger("mlrepro.launch")


class SeedFailed(RuntimeError):
    """The seed's run failed; failure.json in its folder says why.

    `retry` is False when retrying in the same invocation would go against someone's
    decision: a job cancelled with scancel stays failed until the workflow is run again.
    """

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


@functools.lru_cache(maxsize=64)
def _pick_config(impl_dir: Path, nodes: int, gpus_per_node: int, requested: str | None):
    # Sourcing every config_<SYS>.sh costs a bash each; the DAG asks once per seed and rule.
    return implementation.pick_config(impl_dir, nodes, gpus_per_node, requested=requested)


def implementation_config(benchmark: Benchmark, system: System):
    """The config_<SYS>.sh this benchmark uses on this system, read and checked against the system."""
    try:
        return _pick_config(
            benchmark.implementation_dir, system.nodes, system.gpus_per_node,
            system.implementation_configs.get(benchmark.name),
        )
    except implementation.ImplementationError as exc:
        raise ConfigError(f"{benchmark.name} on system {system.name}: {exc}") from None


STAGE_FOLDERS = {"dataset": "data", "checkpoint": "checkpoint"}


def stage_folder(root: Path, benchmark: str, stage: str) -> Path:
    """Where the dataset or checkpoint stage writes: resources/<benchmark>/{data,checkpoint}."""
    return root / "resources" / benchmark / STAGE_FOLDERS[stage]


def stage_location(root: Path, benchmark: str, stage: str) -> Path:
    """The folder runs read a stage's files from: its own, or the user's folder it recorded."""
    folder = stage_folder(root, benchmark, stage)
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        return Path(json.loads((folder / "manifest.json").read_text())["location"])
    return folder


@dataclass(frozen=True)
class SeedPlan:
    benchmark: str
    seed: int
    scheduler: str
    implementation_dir: Path
    config_file: Path
    system_name: str  # DGXSYSTEM, from the config file's name
    nodes: int
    gpus_per_node: int
    walltime_minutes: int
    seed_dir: Path
    env: dict = field(repr=False)
    sbatch: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def local_threads(self) -> int:
        # A local seed occupies one core per rank; a Slurm seed only waits on the head node.
        return self.ranks if self.scheduler == "local" else 1

    @property
    def local_mem_mb(self) -> int:
        # Same reasoning: a waiting Slurm seed must not hold the head node's memory budget,
        # or Snakemake would queue only as many seeds as fit in it.
        return 1000 * self.ranks if self.scheduler == "local" else 100

    def describe(self) -> str:
        shape = f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs ({self.system_name})"
        head = f"{shape}, wall-time {self.walltime_minutes} min"
        if self.scheduler == "slurm":
            return f"{head}: {shlex.join(self.sbatch)}"
        return f"{head}: local run_and_time.sh through submitit"


def plan_seed(settings: Settings, benchmark_name: str, seed: int) -> SeedPlan:
    benchmark = settings.benchmark(benchmark_name)
    if seed not in benchmark.seeds:
        raise ConfigError(f"seed {seed} is not a seed of {benchmark_name} (seeds: {list(benchmark.seeds)})")
    system = settings.system
    cfg = implementation_config(benchmark, system)
    root = settings.root
    seed_dir = root / "results" / benchmark_name / f"seed_{seed}"
    places = {stage: str(stage_location(root, benchmark_name, stage)) for stage in RUN_ENV_PLACEHOLDERS}
    env = {
        **cfg.env,
        **benchmark.env,
        **{key: value.format(**places) for key, value in benchmark.run_env.items()},
        "DGXSYSTEM": cfg.system,
        "SEED": str(seed),
        "NEXP": "1",
    }
    plan = SeedPlan(
        benchmark=benchmark_name,
        seed=seed,
        scheduler=system.scheduler,
        implementation_dir=cfg.path.parent,
        config_file=cfg.path,
        system_name=cfg.system,
        nodes=cfg.nodes,
        gpus_per_node=cfg.gpus_per_node,
        walltime_minutes=cfg.walltime_min,
        seed_dir=seed_dir,
        env=env,
    )
    if system.scheduler == "slurm":
        from mlrepro import slurm

        cmd = slurm.sbatch_command(
            plan.implementation_dir / "run.sub",
            nodes=plan.nodes,
            time_minutes=plan.walltime_minutes,
            partition=system.partition,
            account=system.account,
            exclude=system.exclude_nodes,
            job_name=job_name(benchmark_name, seed, seed_dir),
        )
        plan = SeedPlan(**{**plan.__dict__, "sbatch": tuple(cmd)})
    return plan


def job_name(benchmark: str, seed: int, seed_dir: Path) -> str:
    """The seed's Slurm job name; the folder's hash keeps two checkouts' seeds apart on re-attach."""
    import hashlib

    where = hashlib.sha1(str(seed_dir.resolve()).encode()).hexdigest()[:8]
    return f"mlrepro-{benchmark}-seed{seed}-{where}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def record_failure(seed_dir: Path, reason: str, **details) -> None:
    atomic_write_json(seed_dir / "failure.json", {"reason": reason, "time": _now(), **details})


def finish_seed(plan: SeedPlan, run_log: Path, mllog_out: Path, not_converged: str) -> None:
    """Turn a finished run's log into the seed's mllog.txt, or record why it is not a result."""
    parsed = mllog.parse_text(run_log.read_text(errors="replace") if run_log.exists() else "", source=str(run_log))
    stop = parsed.last("run_stop")
    if parsed.first("run_start") is None or stop is None:
        missing = "run_start" if parsed.first("run_start") is None else "run_stop"
        record_failure(plan.seed_dir, f"no {missing} in the run's MLLOG", state="INCOMPLETE_LOG")
        raise SeedFailed(f"seed {plan.seed}: the run's log has no {missing}; see {run_log}")
    status = (stop.metadata or {}).get("status")
    if status != "success" and not_converged == "rerun":
        record_failure(plan.seed_dir, f"run_stop status {status!r}", state="ABORTED")
        raise SeedFailed(f"seed {plan.seed}: run_stop status {status!r} (benchmark reruns non-converged seeds)")
    atomic_write_text(mllog_out, parsed.to_text())
    with contextlib.suppress(FileNotFoundError):
        (plan.seed_dir / "failure.json").unlink()


# ---------------------------------------------------------------- local (submitit)


# What run_and_time returns when the wall-time ran out (as timeout(1) does).
WALLTIME_EXIT = 124


class _WallTime(Exception):
    pass


def run_and_time(implementation_dir: str, env: dict, log_path: str, pid_file: str) -> int:
    """Run run_and_time.sh to completion; executed by submitit in its own process.

    The run gets its own process group so that a cancel (SIGINT/SIGTERM from submitit or
    Snakemake) takes torchrun and every rank with it, not just the shell. submitit signals
    SIGUSR2 shortly before the wall-time: the run is stopped and WALLTIME_EXIT returned.
    """
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ["bash", "run_and_time.sh"],
            cwd=implementation_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Path(pid_file).write_text(str(proc.pid))

        def stop(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if signum == signal.SIGUSR2:
                raise _WallTime
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, stop)
        try:
            return proc.wait()
        except _WallTime:
            proc.wait()
            out.write(b"\nmlrepro: wall-time reached, run stopped\n")
            return WALLTIME_EXIT


def _kill_stale_local_run(seed_dir: Path) -> None:
    """A local run left behind by a killed workflow would race the new attempt: stop it."""
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        job = json.loads((seed_dir / "job.json").read_text())
        if job.get("scheduler") != "local" or job.get("host") != socket.gethostname():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(job["controller_pid"]), signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            os.killpg(int((seed_dir / "run.pid").read_text()), signal.SIGKILL)


def _run_env(plan: SeedPlan, logdir: Path, **extra: str) -> dict:
    """What the run is started with, locally or by sbatch: the whole environment (as
    sbatch --export=ALL passes it), the plan's settings and the attempt's LOGDIR."""
    return {**os.environ, **plan.env, "LOGDIR": str(logdir), **extra}


def run_seed_local(plan: SeedPlan, system: System, run_log: Path) -> None:
    import submitit

    seed_dir = plan.seed_dir
    seed_dir.mkdir(parents=True, exist_ok=True)
    _kill_stale_local_run(seed_dir)
    logdir = seed_dir / "logdir"
    logdir.mkdir(exist_ok=True)
    run_log.write_text("")  # this attempt's log; an earlier attempt's reason stays in failure.json

    executor = submitit.LocalExecutor(folder=seed_dir / ".submitit", max_num_timeout=0)
    gpus = plan.gpus_per_node if system.device == "cuda" else 0
    # The run is stopped (SIGUSR2) 5 s before submitit's own kill at the wall-time.
    executor.update_parameters(timeout_min=plan.walltime_minutes, gpus_per_node=gpus, tasks_per_node=1,
                               signal_delay_s=5)
    env = _run_env(plan, logdir, DATESTAMP=time.strftime("%y%m%d%H%M%S"),
                   **({"CUDA_VISIBLE_DEVICES": ""} if system.device == "cpu" else {}))
    job = executor.submit(run_and_time, str(plan.implementation_dir), env, str(run_log), str(seed_dir / "run.pid"))
    atomic_write_json(
        seed_dir / "job.json",
        {"scheduler": "local", "host": socket.gethostname(), "controller_pid": int(job.job_id),
         "submitted": _now(), "ranks": plan.ranks, "walltime_minutes": plan.walltime_minutes},
    )

    def cancel(signum, _frame):
        job.cancel()
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, cancel)
    try:
        rc = job.result()
    except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as exc:
        record_failure(seed_dir, f"launcher failed: {str(exc).splitlines()[0]}", state="FAILED")
        raise SeedFailed(f"seed {plan.seed}: launcher failed; see {seed_dir / '.submitit'}") from None
    if rc == WALLTIME_EXIT:
        record_failure(seed_dir, f"timeout: wall-time of {plan.walltime_minutes} min reached", state="TIMEOUT")
        raise SeedFailed(f"seed {plan.seed}: timeout after {plan.walltime_minutes} min; see {run_log}")
    if rc != 0:
        record_failure(seed_dir, f"run_and_time.sh exited with {rc}", state="FAILED", exit_code=rc)
        raise SeedFailed(f"seed {plan.seed}: run_and_time.sh exited with {rc}; see {run_log}")


# ---------------------------------------------------------------- Slurm (run.sub per seed)

# States after which a node is suspected: the seed's retry avoids the nodes it ran on.
NODE_SUSPECT_STATES = {"NODE_FAIL", "FAILED", "OUT_OF_MEMORY"}


def _read_json(path: Path) -> dict | None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return json.loads(path.read_text())
    return None


def _container_image(plan: SeedPlan) -> str:
    """What run.sub gets as CONT: the .sqsh, the pushed or built image, or `none` to run on the host."""
    record = _read_json(plan.seed_dir.parent / "container.json") or {}
    if record.get("runtime", "none") == "none":
        return "none"
    return (record.get("sqsh") or {}).get("path") or (record.get("push") or {}).get("ref") or record["tag"]


def _submit(plan: SeedPlan, system: System, attempt: int) -> dict:
    from mlrepro import slurm

    seed_dir = plan.seed_dir
    logdir = seed_dir / f"attempt_{attempt}"
    logdir.mkdir(parents=True, exist_ok=True)
    suspects = sorted(set((_read_json(seed_dir / "failure.json") or {}).get("suspect_nodes", [])))
    kwargs = dict(
        nodes=plan.nodes,
        time_minutes=plan.walltime_minutes,
        partition=system.partition,
        account=system.account,
        job_name=job_name(plan.benchmark, plan.seed, plan.seed_dir),
        output=str(logdir / "slurm-%j.out"),
        env=_run_env(plan, logdir, CONT=_container_image(plan)),
        workdir=str(logdir),
    )
    exclude = tuple(system.exclude_nodes) + tuple(n for n in suspects if n not in system.exclude_nodes)
    try:
        job_id = slurm.submit(plan.implementation_dir / "run.sub", exclude=exclude, **kwargs)
    except slurm.SlurmError as exc:
        if not suspects:
            raise
        # Too few nodes left without the suspects: run anyway rather than never.
        log.warning("seed %d: cannot exclude %s (%s); submitting without", plan.seed, ",".join(suspects), exc)
        exclude = tuple(system.exclude_nodes)
        job_id = slurm.submit(plan.implementation_dir / "run.sub", exclude=exclude, **kwargs)
    job = {
        "scheduler": "slurm",
        "job_id": job_id,
        "attempt": attempt,
        "logdir": str(logdir),
        "exclude": list(exclude),
        "sbatch": slurm.sbatch_command(plan.implementation_dir / "run.sub", exclude=exclude, **{k: v for k, v in kwargs.items() if k not in ("env", "workdir")}),
        "submitted": _now(),
    }
    atomic_write_json(seed_dir / "job.json", job)
    log.info("seed %d: submitted Slurm job %s (attempt %d)", plan.seed, job_id, attempt)
    return job


def _attach_or_submit(plan: SeedPlan, system: System) -> dict:
    """The seed's Slurm job to wait for: a live or finished-unread one from before, else a new one."""
    from mlrepro import slurm

    job = _read_json(plan.seed_dir / "job.json")
    if job and job.get("scheduler") == "slurm":
        info = slurm.job_info(job["job_id"], status_command=system.slurm_status_command)
        # UNKNOWN: Slurm has forgotten the job (purged from accounting); it cannot be waited for.
        if info.state != "UNKNOWN" and (not slurm.is_terminal(info.state) or not job.get("collected")):
            log.info("seed %d: re-attaching to Slurm job %s (%s)", plan.seed, job["job_id"], info.state)
            return job
    # A job submitted just before the workflow died may not have reached job.json.
    for live in slurm.find_jobs(job_name(plan.benchmark, plan.seed, plan.seed_dir), status_command=system.slurm_status_command):
        if not live.terminal and (job is None or live.job_id != job.get("job_id")):
            log.info("seed %d: re-attaching to unrecorded Slurm job %s", plan.seed, live.job_id)
            attempt = (job or {}).get("attempt", 0) + 1
            logdir = plan.seed_dir / f"attempt_{attempt}"
            job = {"scheduler": "slurm", "job_id": live.job_id, "attempt": attempt, "logdir": str(logdir), "submitted": None}
            atomic_write_json(plan.seed_dir / "job.json", job)
            return job
    return _submit(plan, system, attempt=(job or {}).get("attempt", 0) + 1)


def run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    from mlrepro import slurm

    seed_dir = plan.seed_dir
    seed_dir.mkdir(parents=True, exist_ok=True)
    job = _attach_or_submit(plan, system)
    info = slurm.wait(job["job_id"], poll_seconds=system.slurm_poll_seconds, status_command=system.slurm_status_command)
    logs = sorted(Path(job["logdir"]).glob("*_1.log"))
    run_log.write_text("".join(p.read_text(errors="replace") for p in logs) if logs else "")
    atomic_write_json(
        seed_dir / "job.json",
        {**job, "collected": _now(), "state": info.state, "end": info.end, "elapsed_s": info.elapsed_seconds,
         "nodes": list(info.nodes)},
    )
    if info.state != "COMPLETED":
        previous = (_read_json(seed_dir / "failure.json") or {}).get("suspect_nodes", [])
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
