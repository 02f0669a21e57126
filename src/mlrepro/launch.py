"""Launch one seed's training run the way the implementation's run.sub would.

A seed is one run of the implementation: run_and_time.sh with the environment that
config_<SYS>.sh exports plus DATADIR, MODEL, LOGDIR and SEED. On a `local` system it runs
through submitit's LocalExecutor (timeout = the config's wall-time); on a `slurm` system
run.sub itself is the batch script, submitted once per seed with sbatch.

Seed folder contract (results/<benchmark>/seed_<seed>/, private to the user):
  mllog.txt     the run's MLLOG lines; written last, atomically: its presence means "done"
  run.log       the output of the last attempt that ended (the rule's log), secrets redacted
  attempt_<K>/  each attempt's own folder (LOGDIR): its run.log or Slurm logs, submitit's files
  job.json      the launch of the current attempt (local owner and marker, or Slurm job id)
  failure.json  why the last attempt failed; removed when an attempt succeeds

Before a seed starts, its dataset and checkpoint are checked against their manifests
(`verify_inputs`), and whatever an earlier attempt left running is killed (mlrepro.proctree).
Secrets are never part of what is handed to submitit or written: they reach the run by
inheritance from the workflow's environment.
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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlrepro import implementation, mllog, secrets
from mlrepro.pretrain import segments
from mlrepro.config import Benchmark, ConfigError, Settings, System
from mlrepro.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text

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
    requested = system.implementation_configs.get(benchmark.name)
    try:
        return _pick_config(benchmark.implementation_dir, system.nodes, system.gpus_per_node, requested)
    except implementation.ImplementationError as exc:
        if requested or not _plannable(benchmark):
            raise ConfigError(f"{benchmark.name} on system {system.name}: {exc}") from None
        unfit = exc
    # No published config fits: the planner writes one for this system, which then fits exactly.
    from mlrepro.plan import generate, hardware, search

    try:
        generate.generate_config(benchmark, system)
    except (search.PlanError, hardware.HardwareUnknown) as why:
        raise ConfigError(f"{benchmark.name} on system {system.name}: {unfit}\n"
                          f"mlrepro plan could not generate one either: {why}") from None
    _pick_config.cache_clear()
    return _pick_config(benchmark.implementation_dir, system.nodes, system.gpus_per_node, None)


def _plannable(benchmark: Benchmark) -> bool:
    """An NVIDIA benchmark the planner has rules for, with published configs to start from."""
    from mlrepro.plan import workloads

    folder = Path(benchmark.implementation_dir)
    return (benchmark.mlperf_benchmark in workloads.BENCHMARKS and folder.is_dir()
            and bool(implementation.list_configs(folder)))


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
    generated: bool = False  # the config was written by mlrepro plan, not published

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
        if self.generated:
            head += f" [{self.config_file.name} generated by mlrepro plan]"
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
    places = {stage: str(stage_location(root, benchmark_name, stage)) for stage in STAGE_FOLDERS}
    places["corpus"] = str(root / "resources" / "corpora" / (benchmark.corpus or "none"))
    env = {
        **cfg.env,
        **benchmark.env,
        **{key: value.format(**places) for key, value in benchmark.run_env.items()},
        "DGXSYSTEM": cfg.system,
        "SEED": str(seed),
        "NEXP": "1",
    }
    walltime = cfg.walltime_min
    chain = segments.limits(benchmark.pretrain, system.max_job_minutes)
    if chain is not None:  # a checkpointing pretraining run: each job is one segment of the seed
        env.update(segments.run_env(chain, seed_dir))
        walltime = segments.walltime_minutes(chain, walltime)
    plan = SeedPlan(
        benchmark=benchmark_name,
        seed=seed,
        scheduler=system.scheduler,
        implementation_dir=cfg.path.parent,
        config_file=cfg.path,
        system_name=cfg.system,
        nodes=cfg.nodes,
        gpus_per_node=cfg.gpus_per_node,
        walltime_minutes=walltime,
        seed_dir=seed_dir,
        env=env,
        generated=_generated(cfg.path),
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


def _generated(config_path: Path) -> bool:
    from mlrepro.plan import generate

    return generate.is_generated(config_path)


def job_name(benchmark: str, seed: int, seed_dir: Path) -> str:
    """The seed's Slurm job name; the folder's hash keeps two checkouts' seeds apart on re-attach."""
    import hashlib

    where = hashlib.sha1(str(seed_dir.resolve()).encode()).hexdigest()[:8]
    return f"mlrepro-{benchmark}-seed{seed}-{where}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# Room kept for failure.json (a file of this size), so that a full disk can still say why a seed failed.
RESERVE_NAME = ".failure.reserve"
RESERVE_BYTES = 16384


def record_failure(seed_dir: Path, reason: str, **details) -> bool:
    """Write failure.json; False (and the reason logged) when the folder cannot take it."""
    record = {"reason": reason, "time": _now(), **details}
    for room in (None, seed_dir / RESERVE_NAME):
        if room is not None:
            # A full disk: the room kept at the attempt's start is freed for this file.
            try:
                room.unlink()
            except OSError:
                break
        try:
            atomic_write_json(seed_dir / "failure.json", record)
            return True
        except OSError as exc:
            error = exc
    log.error("%s: cannot write failure.json (%s); the seed failed: %s", seed_dir, error.strerror, reason)
    return False


def verify_inputs(plan: SeedPlan, root: Path) -> None:
    """Fail the seed, naming the file, when its dataset or checkpoint changed after its manifest was written."""
    from mlrepro import data

    problems = []
    for stage in STAGE_FOLDERS:
        manifest = stage_folder(root, plan.benchmark, stage) / "manifest.json"
        if manifest.is_file():
            problems += data.verify_manifest(manifest)
    if problems:
        record_failure(plan.seed_dir, "input files changed since their manifest: " + "; ".join(problems[:5]),
                       state="INPUT_CHANGED", problems=problems)
        raise SeedFailed(f"seed {plan.seed}: the data it would use changed since it was verified:\n  "
                         + "\n  ".join(problems[:20]) + "\n(run the data stage again: delete the folder)",
                         retry=False)


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
    for name in ("failure.json", RESERVE_NAME):
        with contextlib.suppress(FileNotFoundError):
            (plan.seed_dir / name).unlink()


# ---------------------------------------------------------------- local (submitit)


# What run_and_time returns when the wall-time ran out (as timeout(1) does).
WALLTIME_EXIT = 124
# What it returns when the run's log could not be written (disk full, read-only): the run is stopped.
LOG_WRITE_EXIT = 125


class _WallTime(Exception):
    pass


def run_and_time(implementation_dir: str, env: dict, log_path: str, pid_file: str) -> int:
    """Run run_and_time.sh to completion; executed by submitit in its own process.

    `env` holds the run's settings only; secrets reach the run through this process's own
    environment (inherited from the workflow), because `env` is pickled to disk by submitit.
    The output goes to `log_path` with secrets redacted as it is written. Every process of
    the run carries the seed's marker (see mlrepro.proctree): a cancel (SIGINT/SIGTERM from
    submitit or Snakemake), the wall-time (submitit's SIGUSR2) or the end of the run kills
    all of them, including ranks that torchrun started in sessions of their own.
    """
    import threading

    from mlrepro import proctree, secrets

    child_env = {**os.environ, **env}
    marker = child_env[proctree.MARKER]
    hide = secrets.redactor(child_env)
    write_error: list[str] = []
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ["bash", "run_and_time.sh"],
            cwd=implementation_dir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Path(pid_file).write_text(str(proc.pid))

        def pump():
            for line in proc.stdout:
                if write_error:
                    continue  # keep draining so the run is never blocked on a full pipe
                try:
                    out.write(hide.line_bytes(line))
                    out.flush()
                except OSError as exc:
                    write_error.append(f"cannot write the run's log {log_path}: {exc.strerror}")
                    with contextlib.suppress(proctree.Survivors):
                        proctree.kill(marker)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()

        def stop(signum, _frame):
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(marker)
            if signum == signal.SIGUSR2:
                raise _WallTime
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, stop)
        try:
            rc = proc.wait()
            # What outlived run_and_time.sh (a rank in its own session) would hold the pipe open.
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(marker)
            reader.join()
        except _WallTime:
            proc.wait()
            reader.join()
            with contextlib.suppress(OSError):
                out.write(b"\nmlrepro: wall-time reached, run stopped\n")
            return WALLTIME_EXIT
        finally:
            # Ranks that outlived run_and_time.sh must not outlive the seed.
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(marker)
    if write_error:
        print(write_error[0], file=sys.stderr)
        return LOG_WRITE_EXIT
    return rc


@contextlib.contextmanager
def _environ(**values: str):
    """os.environ with `values` added for the duration (submitit starts its job with os.environ)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop_earlier_attempts(seed_dir: Path, marker: str) -> None:
    """Whatever an earlier attempt or a killed workflow left running would race the new
    attempt: stop it all, and start nothing while any of it is left."""
    from mlrepro import proctree

    job = _read_json(seed_dir / "job.json") or {}
    if job.get("scheduler") == "local" and job.get("host") == socket.gethostname():
        # The process that waited on that attempt (its workflow may be gone, it may not).
        proctree.kill_process(int(job.get("owner_pid") or 0), job.get("owner_start"))
    try:
        stopped = proctree.kill(marker)
    except proctree.Survivors as exc:
        record_failure(seed_dir, str(exc), state="LEFTOVER_PROCESSES")
        raise SeedFailed(f"seed {seed_dir.name}: {exc}", retry=False) from None
    if stopped:
        log.warning("%s: stopped %d process(es) left by an earlier attempt: %s", seed_dir.name, len(stopped),
                    ", ".join(f"{p.pid} {p.command[:60]}" for p in stopped))


def _next_attempt(seed_dir: Path) -> int:
    numbers = [int(p.name.split("_")[1]) for p in seed_dir.glob("attempt_*") if p.name.split("_")[1].isdigit()]
    return max(numbers, default=0) + 1


def _run_env(plan: SeedPlan, logdir: Path, **extra: str) -> dict:
    """The run's settings, as given to submitit or sbatch: the plan's variables and the
    attempt's LOGDIR, nothing from this process's environment. That one reaches the run by
    inheritance (submitit's job, sbatch --export=ALL), so no secret is ever serialized."""
    return {**plan.env, "LOGDIR": str(logdir), **extra}


def _private(*folders: Path) -> None:
    """Folders that hold run parameters are the user's alone (also ones an older version made)."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.chmod(0o700)


def run_seed_local(plan: SeedPlan, system: System, run_log: Path) -> None:
    import submitit

    from mlrepro import proctree

    seed_dir = plan.seed_dir
    marker = proctree.seed_marker(seed_dir)
    try:
        seed_dir.mkdir(parents=True, exist_ok=True)
        _private(seed_dir, *seed_dir.glob("attempt_*"), *seed_dir.glob(".submitit"))
    except OSError as exc:
        _io_failure(plan, exc)
    _stop_earlier_attempts(seed_dir, marker)
    attempt = _next_attempt(seed_dir)
    logdir = seed_dir / f"attempt_{attempt}"
    attempt_log = logdir / "run.log"
    reserve = seed_dir / RESERVE_NAME
    watchdog = None
    try:
        logdir.mkdir(mode=0o700)
        _reserve(reserve)
        attempt_log.write_text("")
        atomic_write_text(run_log, f"attempt {attempt} running; its log is {attempt_log}\n")
        executor = submitit.LocalExecutor(folder=logdir / ".submitit", max_num_timeout=0)
        gpus = plan.gpus_per_node if system.device == "cuda" else 0
        # The run is stopped (SIGUSR2) 5 s before submitit's own kill at the wall-time.
        executor.update_parameters(timeout_min=plan.walltime_minutes, gpus_per_node=gpus, tasks_per_node=1,
                                   signal_delay_s=5)
        env = _run_env(plan, logdir, DATESTAMP=time.strftime("%y%m%d%H%M%S"), **{proctree.MARKER: marker},
                       **({"CUDA_VISIBLE_DEVICES": ""} if system.device == "cpu" else {}))
        watchdog = proctree.start_watchdog(marker)
        # submitit's controller and job inherit os.environ: with the marker they are the seed's too.
        with _environ(**{proctree.MARKER: marker}):
            job = executor.submit(run_and_time, str(plan.implementation_dir), env, str(attempt_log),
                                  str(logdir / "run.pid"))
        atomic_write_json(
            seed_dir / "job.json",
            {"scheduler": "local", "host": socket.gethostname(), "controller_pid": int(job.job_id),
             "owner_pid": os.getpid(), "owner_start": proctree.start_time(os.getpid()), "attempt": attempt,
             "logdir": str(logdir), "submitted": _now(), "ranks": plan.ranks,
             "walltime_minutes": plan.walltime_minutes},
        )

        def cancel(signum, _frame):
            job.cancel()
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(marker)
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, cancel)
        try:
            rc = job.result()
        except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as exc:
            # On a full or read-only disk submitit cannot even store the result: say so.
            _probe_writable(logdir)
            record_failure(seed_dir, f"launcher failed: {str(exc).splitlines()[0]}", state="FAILED", attempt=attempt)
            raise SeedFailed(f"seed {plan.seed}: launcher failed; see {logdir / '.submitit'}") from None
        finally:
            _take_log(attempt_log, run_log)
    except OSError as exc:
        _io_failure(plan, exc)
    finally:
        with contextlib.suppress(proctree.Survivors):
            proctree.kill(marker)
        if watchdog is not None:
            watchdog.terminate()
            watchdog.wait()
    if rc == LOG_WRITE_EXIT:
        try:
            _probe_writable(logdir)
        except OSError as exc:
            _io_failure(plan, exc)
        _io_failure(plan, OSError(f"the run's log {attempt_log} could not be written"))
    if rc == WALLTIME_EXIT:
        record_failure(seed_dir, f"timeout: wall-time of {plan.walltime_minutes} min reached", state="TIMEOUT",
                       attempt=attempt)
        raise SeedFailed(f"seed {plan.seed}: timeout after {plan.walltime_minutes} min; see {run_log}")
    if rc != 0:
        record_failure(seed_dir, f"run_and_time.sh exited with {rc}", state="FAILED", exit_code=rc, attempt=attempt)
        raise SeedFailed(f"seed {plan.seed}: run_and_time.sh exited with {rc}; see {run_log}")


def _take_log(attempt_log: Path, run_log: Path) -> None:
    """The rule's run.log becomes the attempt's own log (each attempt keeps its own in attempt_K/)."""
    with contextlib.suppress(OSError):
        atomic_write_bytes(run_log, attempt_log.read_bytes())




def _reserve(path: Path) -> None:
    with open(path, "wb") as fh:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fallocate(fh.fileno(), 0, RESERVE_BYTES)


def _probe_writable(folder: Path) -> None:
    """Raise the OSError that writing into `folder` gives now, if any."""
    probe = folder / ".write-probe"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def _io_failure(plan: SeedPlan, exc: OSError) -> None:
    """A full or read-only results folder fails the seed with its reason, not a traceback.
    Not retried in this invocation: the disk does not change by itself; a rerun recovers."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    reason = f"cannot write the seed's files: {exc.strerror or exc}{where}"
    if not record_failure(plan.seed_dir, reason, state="IO_ERROR"):
        reason += "; failure.json could not be written either"
    raise SeedFailed(f"seed {plan.seed}: {reason}", retry=False) from None


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
    try:
        _run_seed_slurm(plan, system, run_log)
    except OSError as exc:
        _io_failure(plan, exc)


def _run_seed_slurm(plan: SeedPlan, system: System, run_log: Path) -> None:
    from mlrepro import slurm

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
