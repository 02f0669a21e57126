"""A seed attempt that finished after its workflow died, taken as the seed's run instead of trained again.

A workflow killed while a seed's run writes its last lines, or between the run's end and the seed's
output, leaves an attempt that is whole: its log holds the complete run. Snakemake marks the seed's
output incomplete and a rerun runs the seed's job again; that job first looks here, so the finished
run is kept (its log becomes the seed's run.log, then the kind's finish_seed judges it as it would
have) and no training is repeated or overwritten.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from mlrepro import paths
from mlrepro.launch.job import SeedPlan
from mlrepro.util.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)


def attempt_log(plan: SeedPlan) -> Path | None:
    """The log of the seed's latest attempt once nothing of it runs any more; None while it may
    still run (a Slurm job not yet collected is re-attached to instead) or when there is none."""
    job = paths.read_job(plan.seed_dir) or {}
    logdir = Path(job["logdir"]) if job.get("logdir") else None
    if logdir is None or not logdir.is_dir():
        return None
    if job.get("scheduler") == "local":
        if job.get("host") != socket.gethostname():
            return None
        from mlrepro.launch import local
        from mlrepro.util import proctree

        local.stop_earlier_attempts(plan.seed_dir, proctree.seed_marker(plan.seed_dir))
        return logdir / "run.log" if (logdir / "run.log").is_file() else None
    if job.get("scheduler") == "slurm" and job.get("collected") and job.get("state") == "COMPLETED":
        logs = sorted(logdir.glob("*_1.log"))
        if logs:
            joined = logdir / "adopted.log"
            atomic_write_bytes(joined, b"".join(p.read_bytes() for p in logs))
            return joined
    return None


def take_finished_attempt(plan: SeedPlan, run_log: Path) -> bool:
    """Make the latest attempt's log the seed's run.log, when there is one to judge; True if so."""
    found = attempt_log(plan)
    if found is None or found.stat().st_size == 0:
        return False
    log.info("seed %d: judging the run of %s, left by an earlier workflow, before training again",
             plan.seed, found.parent.name)
    atomic_write_bytes(run_log, found.read_bytes())
    return True
