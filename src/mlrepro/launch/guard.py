"""The run's guard: every process of a workflow run dies with the snakemake process that started it.

Snakemake's jobs outlive a SIGKILL of snakemake's own process (not its group): a seed trains on,
a download goes on, and their outputs land where the rerun will not trust them (a seed redone, a
dataset fetched twice, two runs of one stage writing one folder). So the main snakemake process,
while it parses the Snakefile, tags its environment with RUN_MARKER=<id>, which every job inherits
(stages, submitit, run_and_time, torchrun's ranks, and Slurm jobs through sbatch's exported
environment), and starts this guard in a session of its own. Once that process is gone the guard
kills every process carrying the tag, cancels the Slurm jobs the run submitted (whose working folder
is inside the workflow's), and, when no other snakemake runs in the folder, removes the lock the
dead one left: the plain rerun then starts without `--unlock`. The rerun does the same as it starts
(release_stale_lock), so that it need not wait for a guard still cancelling jobs, or for one that
died with the machine.

A seed's own Slurm job (run.sub, submitted by mlrepro.launch.slurm into the seed's folder) is left to
run: the rerun re-attaches to it, so no training is lost or run twice. Its processes carry the tag
too (on a one-machine cluster they are here), so the guard kills only the tagged processes of the
Slurm job snakemake itself ran in (none, or the allocation it was started inside), and cancels only
the jobs whose working folder is the workflow's own (the executor plugin's stage jobs).

A process that carries the tag already (a job's own snakemake, re-parsing the Snakefile) starts no
guard: the run has one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from mlrepro.slurm import client as slurm
from mlrepro.util import proctree

RUN_MARKER = "MLREPRO_RUN_ID"

log = logging.getLogger(__name__)


def guard_workflow(workdir: str | os.PathLike) -> str | None:
    """Tag this process's environment (inherited by every job) and start its guard; the tag, or None
    when this process belongs to a run that has its guard already."""
    if os.environ.get(RUN_MARKER):
        return None
    marker = uuid.uuid4().hex
    owner = os.getpid()
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER}
    subprocess.Popen(
        [sys.executable, "-m", "mlrepro.launch.guard", str(owner), str(proctree.start_time(owner)), marker,
         str(Path(workdir).resolve()), time.strftime("%Y-%m-%dT%H:%M:%S"), os.environ.get("SLURM_JOB_ID", "")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )
    os.environ[RUN_MARKER] = marker
    return marker


def watch(owner: int, owner_start: int, marker: str, workdir: Path, started: str, slurm_job: str,
          poll: float = 0.2) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C of the workflow must not stop the guard
    while proctree.start_time(owner) == owner_start:
        time.sleep(poll)
    stop_run(marker, workdir, started, slurm_job)


def run_processes(marker: str, slurm_job: str = "") -> list[proctree.Proc]:
    """The live processes of the run started here (tagged, in the Slurm job `slurm_job` or in none)."""
    found = []
    for proc in proctree.find(marker, RUN_MARKER):
        try:
            env = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        job = next((v.partition(b"=")[2].decode() for v in env if v.startswith(b"SLURM_JOB_ID=")), "")
        if job == slurm_job:
            found.append(proc)
    return found


def kill_run_processes(marker: str, slurm_job: str = "", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (procs := run_processes(marker, slurm_job)) and time.monotonic() < deadline:
        for proc in procs:
            proctree.kill_process(proc.pid, proc.start)
        time.sleep(0.1)


def stop_run(marker: str, workdir: Path, started: str, slurm_job: str = "") -> None:
    """What is left of the run once its snakemake is gone: its processes, its Slurm jobs, its lock."""
    kill_run_processes(marker, slurm_job)
    # Another snakemake here (a dry run, `mlrepro status`'s, a rerun already started) may own the
    # jobs and the lock: neither is touched while one runs.
    if snakemake_running_in(workdir, besides=marker):
        return
    release_lock(workdir)  # first: asking Slurm may take seconds, and a rerun may start meanwhile
    cancel_slurm_jobs(workdir, started)


def cancel_slurm_jobs(workdir: Path, started: str) -> None:
    """Cancel the stage jobs this run submitted through the executor plugin: nothing waits for them any
    more, and a rerun would race them."""
    if shutil.which("squeue") is None:
        return
    try:
        for job_id in slurm.live_jobs_in(workdir, submitted_since=started):
            with contextlib.suppress(slurm.SlurmError):
                slurm.cancel(job_id)
    except (slurm.SlurmError, OSError) as exc:
        log.warning("could not cancel the run's Slurm jobs: %s", exc)


def snakemake_running_in(workdir: Path, besides: str = "") -> list[int]:
    """Live snakemake processes whose working folder is `workdir`, the run `besides`'s own left out
    (the executor plugin's jobs run a snakemake of their own, in the workflow's folder)."""
    ours = f"{RUN_MARKER}={besides}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if Path(entry.path, "cwd").resolve() != workdir:
                continue
            command = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            if besides and ours in Path(entry.path, "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if any(part.endswith(b"snakemake") for part in command[:3]):
            found.append(int(entry.name))
    return found


def release_stale_lock(workdir: str | os.PathLike) -> None:
    """At the start of a run (snakemake locks the folder after parsing the Snakefile): the lock of a
    snakemake that is gone, released; a live one's is left, and snakemake refuses to run beside it."""
    workdir = Path(workdir).resolve()
    if not [pid for pid in snakemake_running_in(workdir) if pid != os.getpid()]:
        release_lock(workdir)


def release_lock(workdir: Path) -> None:
    """Snakemake's lock of `workdir`, left by a killed snakemake: removed when no snakemake runs there
    (what `snakemake --unlock` does, which a killed run's error message asks the user for)."""
    locks = workdir / ".snakemake" / "locks"
    if not locks.is_dir():
        return
    for lock in locks.glob("*.lock"):
        with contextlib.suppress(OSError):
            lock.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlrepro.launch.guard",
                                     description="stop a workflow run's processes once its snakemake is gone")
    parser.add_argument("owner", type=int)
    parser.add_argument("owner_start", type=int)
    parser.add_argument("marker")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("started", help="when the run started (squeue's time format)")
    parser.add_argument("slurm_job", nargs="?", default="", help="the Slurm job snakemake runs in, if any")
    args = parser.parse_args(argv)
    watch(args.owner, args.owner_start, args.marker, args.workdir, args.started, args.slurm_job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
