"""The local backend: one seed's run_and_time.sh through submitit's LocalExecutor, its whole process tree stopped at the end."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import submitit

from mlrepro import paths
from mlrepro.config import System
from mlrepro.launch import attempt as attempt_policy
from mlrepro.launch.job import (
    RESERVE_BYTES,
    Diverged,
    EarlyStopped,
    SeedFailed,
    SeedPlan,
    diverged,
    early_stop_settled,
    io_failure,
    now,
    private_folders,
    record_attempt,
    record_failure,
    run_env,
    save_signal_after,
    write_job,
)
from mlrepro.paths import JobRecord
from mlrepro.preflight import gpus as node_gpus
from mlrepro.preflight import quick
from mlrepro.util import proctree, secrets
from mlrepro.util.fsutil import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)


# What run_and_time returns when the wall-time ran out (as timeout(1) does).
WALLTIME_EXIT = 124
# What it returns when the run's log could not be written (disk full, read-only): the run is stopped.
LOG_WRITE_EXIT = 125
# What it returns when the quick preflight failed this node before training (mlrepro.preflight.quick).
PREFLIGHT_EXIT = 126


class _WallTime(Exception):
    pass


def run_and_time(implementation_dir: str, env: dict, log_path: str, pid_file: str, cores: int | None = None) -> int:
    """Run run_and_time.sh to completion; executed by submitit in its own process.

    `env` holds the run's settings only; secrets reach the run through this process's own
    environment (inherited from the workflow), because `env` is pickled to disk by submitit.
    The output goes to `log_path` with secrets redacted as it is written. Every process of
    the run carries the seed's marker (see mlrepro.util.proctree): a cancel (SIGINT/SIGTERM from
    submitit or Snakemake), the wall-time (submitit's SIGUSR2) or the end of the run kills
    all of them, including ranks that torchrun started in sessions of their own.
    """
    if cores:
        # A system with fewer cores (config/systems/local-slow.yaml): the run's processes inherit it.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    child_env = {**os.environ, **env}
    marker = child_env[proctree.MARKER]
    hide = secrets.redactor(child_env)
    write_error: list[str] = []
    if "CUDA_VISIBLE_DEVICES" in env:
        # The quick preflight measures in this process, whose GPUs submitit renumbered from 0 (given_gpus).
        os.environ["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    if preflight_failed(Path(log_path)):
        return PREFLIGHT_EXIT
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
            # What outlived run_and_time.sh (a rank in its own session) would hold the pipe open:
            # killed until the pipe closes (a rank still being exec'd is caught on a later look).
            while True:
                with contextlib.suppress(proctree.Survivors):
                    proctree.kill(marker)
                reader.join(timeout=1.0)
                if not reader.is_alive():
                    break
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


def _energy(plan: SeedPlan, system: System, env: dict) -> float | None:
    """NVML's energy counters of the seed's GPUs (None on a CPU system)."""
    if system.device == "cpu":
        return None
    return node_gpus.energy_j(env.get("CUDA_VISIBLE_DEVICES"), plan.gpus_per_node)


def given_gpus(parent: str | None, gpus: int) -> dict[str, str]:
    """The GPUs the seed's job runs on: those this process was given. submitit's LocalExecutor numbers a
    job's GPUs from 0 (CUDA_VISIBLE_DEVICES=0,1,..) whatever this process's CUDA_VISIBLE_DEVICES says, so a
    workflow given GPUs 2,3 of a node (Slurm's --gpus on a shared node, two lanes of one machine) would
    train on GPUs 0,1, someone else's."""
    if parent is None or gpus < 1:
        return {}
    given = [d.strip() for d in parent.split(",") if d.strip()]
    if len(given) < gpus:
        raise SeedFailed(f"the seed needs {gpus} GPU(s); CUDA_VISIBLE_DEVICES={parent!r} gives {len(given)}",
                         retry=False)
    return {"CUDA_VISIBLE_DEVICES": ",".join(given[:gpus])}


def stop_earlier_attempts(seed_dir: Path, marker: str) -> None:
    """Whatever an earlier attempt or a killed workflow left running would race the new
    attempt: stop it all, and start nothing while any of it is left."""
    job = paths.read_job(seed_dir)
    if job is not None and job.scheduler == "local" and job.host == socket.gethostname():
        # The process that waited on that attempt (its workflow may be gone, it may not).
        proctree.kill_process(int(job.owner_pid or 0), job.owner_start)
    try:
        stopped = proctree.kill(marker)
    except proctree.Survivors as exc:
        record_failure(seed_dir, str(exc), state="LEFTOVER_PROCESSES")
        raise SeedFailed(f"seed {seed_dir.name}: {exc}", retry=False) from None
    if stopped:
        log.warning("%s: stopped %d process(es) left by an earlier attempt: %s", seed_dir.name, len(stopped),
                    ", ".join(f"{p.pid} {p.command[:60]}" for p in stopped))


def run_seed_local(plan: SeedPlan, system: System, run_log: Path) -> None:
    seed_dir, files = plan.seed_dir, plan.files
    marker = proctree.seed_marker(seed_dir)  # every attempt's processes (stopped before a new attempt)
    try:
        seed_dir.mkdir(parents=True, exist_ok=True)
        private_folders(seed_dir, *(a.folder for a in files.attempts()),
                        *([files.submitit] if files.submitit.exists() else []))
    except OSError as exc:
        io_failure(plan, exc)
    stop_earlier_attempts(seed_dir, marker)
    attempt = files.next_attempt()
    # What this attempt starts, stops and guards: an earlier attempt's watchdog (its workflow
    # SIGKILLed a moment ago) may still be at work, and must not take this attempt for its own.
    ours = proctree.attempt_marker(marker, attempt)
    here = files.attempt(attempt)
    logdir = here.folder
    attempt_log = here.run_log
    reserve = files.failure_reserve
    watchdog = None
    started, t0, state = None, time.monotonic(), "FAILED"
    try:
        logdir.mkdir(mode=0o700)
        _reserve(reserve)
        attempt_log.write_text("")
        atomic_write_text(run_log, f"attempt {attempt} running; its log is {attempt_log}\n")
        executor = submitit.LocalExecutor(folder=here.submitit, max_num_timeout=0)
        gpus = plan.gpus_per_node if system.device == "cuda" else 0
        # The run is stopped (SIGUSR2) 5 s before submitit's own kill at the wall-time.
        executor.update_parameters(timeout_min=plan.walltime_minutes, gpus_per_node=gpus, tasks_per_node=1,
                                   signal_delay_s=5)
        env = run_env(plan, logdir, DATESTAMP=time.strftime("%y%m%d%H%M%S"), **{proctree.MARKER: ours},
                       **({"CUDA_VISIBLE_DEVICES": ""} if system.device == "cpu"
                          else given_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)))
        watchdog = proctree.start_watchdog(ours)
        # submitit's controller and job inherit os.environ: with the marker they are the seed's too.
        with _environ(**{proctree.MARKER: ours}):
            job = executor.submit(run_and_time, str(plan.implementation_dir), env, str(attempt_log),
                                  str(here.pid_file), system.cores)
        _record_job(plan, int(job.job_id), attempt, logdir)
        started, t0, joules = now(), time.monotonic(), _energy(plan, system, env)
        record_attempt(logdir, attempt, "local", nodes=plan.nodes, gpus_per_node=plan.gpus_per_node, start=started,
                       device=system.device)

        def cancel(signum, _frame):
            job.cancel()
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(ours)
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, cancel)
        rule = attempt_policy.HangRule.of(plan.hang)
        watch = attempt_policy.HangWatch(rule, lambda: [attempt_log]) if rule else None
        injection = attempt_policy.Injection.of(plan.inject_failures)
        why = _wait_or_stop(job, plan, ours, watch, here.pid_file,
                            injection.kill_after(plan.seed, attempt) if injection else None)
        if why is not None and why.startswith(attempt_policy.INJECTED):
            state = attempt_policy.INJECTED_STATE
            _take_log(attempt_log, run_log)
            record_failure(seed_dir, why, state=state, attempt=attempt)
            raise SeedFailed(f"seed {plan.seed}: {why}")
        if why is not None and why.startswith(HUNG):
            state = "HUNG"
            _take_log(attempt_log, run_log)
            record_failure(seed_dir, why, state="HUNG", attempt=attempt, nodes=[socket.gethostname()],
                           last_line=watch.last_line)
            raise SeedFailed(f"seed {plan.seed}: {why}")
        if why == "stopped":
            state = "CANCELLED"
            record_failure(seed_dir, "early stop: the reproduction is settled; this seed was cancelled",
                           state="STOPPED", attempt=attempt)
            raise EarlyStopped(f"seed {plan.seed}: cancelled by the early stop")
        if why is not None:
            state = "DIVERGED"
            record_failure(seed_dir, why, state="DIVERGED", attempt=attempt)
            raise Diverged(f"seed {plan.seed}: cancelled, {why}")
        try:
            rc = job.result()
            state = {0: "COMPLETED", WALLTIME_EXIT: "TIMEOUT", PREFLIGHT_EXIT: "PREFLIGHT_FAILED"}.get(rc, "FAILED")
        except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as exc:
            # On a full or read-only disk submitit cannot even store the result: say so.
            _probe_writable(logdir)
            record_failure(seed_dir, f"launcher failed: {str(exc).splitlines()[0]}", state="FAILED", attempt=attempt)
            raise SeedFailed(f"seed {plan.seed}: launcher failed; see {here.submitit}") from None
        finally:
            _take_log(attempt_log, run_log)
    except OSError as exc:
        io_failure(plan, exc)
    finally:
        with contextlib.suppress(proctree.Survivors):
            proctree.kill(ours)
        if watchdog is not None:
            watchdog.terminate()
            watchdog.wait()
        if started is not None:
            record_attempt(logdir, attempt, "local", nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
                           start=started, end=now(), elapsed_s=round(time.monotonic() - t0, 3), state=state,
                           energy_j=node_gpus.energy_between(joules, _energy(plan, system, env)), device=system.device)
    _check_exit(plan, rc, attempt, attempt_log, run_log)


HUNG = "hung: "


def _wait_or_stop(job, plan: SeedPlan, marker: str, watch: attempt_policy.HangWatch | None = None,
                  pid_file: Path | None = None, kill_after: float | None = None) -> str | None:
    """Wait for the attempt; why it was cancelled meanwhile ("stopped": the early stop settled the
    reproduction; "diverged: ...": its evaluations left the reference band; "hung: ...": no progress
    for longer than the hang rule allows; "injected: ...": `kill_after` seconds passed, the failure
    injection's draw), or None. At a segment's save time its run gets SIGUSR1."""
    save_after, started, signalled = save_signal_after(plan), time.monotonic(), False
    injection = attempt_policy.Injection.of(plan.inject_failures)
    while not job.done():
        gone = diverged(plan)
        why = "stopped" if early_stop_settled(plan) else (gone.get("reason") or "diverged") if gone is not None else None
        if why is None and watch is not None and (hung := watch.poll()):
            why = HUNG + hung
        if why is None and kill_after is not None and injection and time.monotonic() - started >= kill_after:
            why = injection.reason(time.monotonic() - started)
        if why:
            job.cancel()
            with contextlib.suppress(proctree.Survivors):
                proctree.kill(marker)
            return why
        if (save_after is not None and not signalled and time.monotonic() - started >= save_after
                and pid_file is not None and pid_file.is_file()):
            signalled = bool(proctree.send(marker, signal.SIGUSR1, under=int(pid_file.read_text())))
            log.info("seed %d: SIGUSR1 sent %.0f s before the job's limit: save and stop", plan.seed,
                     plan.save_signal_s)
        time.sleep(1)
    return None


def preflight_failed(log_path: Path) -> bool:
    """The quick preflight inside the allocation (mlrepro.preflight.quick); True when this node failed it."""
    try:
        _, why = quick.check(log_path.parent)
    except OSError:
        return False  # an unwritable folder: the run's own log write reports it
    if why:
        with open(log_path, "a") as out:
            out.write(f"mlrepro: {why}\n")
    return why is not None


def preflight_reason(logdir: Path) -> str | None:
    """Why the attempt's quick preflight failed its node (exit 126 is also bash's "cannot execute")."""
    host = paths.read_json_if_exists(logdir / quick.RECORD)
    return quick.reason(host) if host else None


def _record_job(plan: SeedPlan, controller_pid: int, attempt: int, logdir: Path) -> None:
    """job.json of a local attempt: who waits on it (to stop it after a crash) and where it logs."""
    write_job(plan.seed_dir, JobRecord(
        scheduler="local", host=socket.gethostname(), controller_pid=controller_pid, owner_pid=os.getpid(),
        owner_start=proctree.start_time(os.getpid()), attempt=attempt, logdir=logdir, submitted=now(),
        ranks=plan.ranks, walltime_minutes=plan.walltime_minutes))


def _check_exit(plan: SeedPlan, rc: int, attempt: int, attempt_log: Path, run_log: Path) -> None:
    """Fail the seed, with its reason recorded, unless run_and_time ended with 0."""
    if rc == LOG_WRITE_EXIT:
        try:
            _probe_writable(attempt_log.parent)
        except OSError as exc:
            io_failure(plan, exc)
        io_failure(plan, OSError(f"the run's log {attempt_log} could not be written"))
    if rc == PREFLIGHT_EXIT and (why := preflight_reason(attempt_log.parent)):
        host = paths.read_json_if_exists(attempt_log.parent / quick.RECORD)
        record_failure(plan.seed_dir, why, state="PREFLIGHT_FAILED", attempt=attempt, suspect_nodes=[host["host"]],
                       preflight=host)
        raise SeedFailed(f"seed {plan.seed}: {why}; see {attempt_log.parent / quick.RECORD}")
    if rc == WALLTIME_EXIT:
        record_failure(plan.seed_dir, f"timeout: wall-time of {plan.walltime_minutes} min reached", state="TIMEOUT",
                       attempt=attempt)
        raise SeedFailed(f"seed {plan.seed}: timeout after {plan.walltime_minutes} min; see {run_log}")
    if rc != 0:
        record_failure(plan.seed_dir, f"run_and_time.sh exited with {rc}", state="FAILED", exit_code=rc,
                       attempt=attempt)
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

