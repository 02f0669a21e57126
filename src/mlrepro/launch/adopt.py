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
from mlrepro.launch import local
from mlrepro.launch.job import SeedPlan
from mlrepro.paths import AttemptPaths
from mlrepro.util import proctree
from mlrepro.util.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)


def attempt_log(plan: SeedPlan) -> Path | None:
    """The log of the seed's latest attempt once nothing of it runs any more; None while it may
    still run (a Slurm job not yet collected is re-attached to instead) or when there is none."""
    job = paths.read_job(plan.seed_dir)
    if job is None or job.logdir is None or not job.logdir.is_dir():
        return None
    here = AttemptPaths(job.logdir)
    if job.scheduler == "local":
        if job.host != socket.gethostname():
            return None
        local.stop_earlier_attempts(plan.seed_dir, proctree.seed_marker(plan.seed_dir))
        return here.run_log if here.run_log.is_file() else None
    if job.scheduler == "slurm" and job.collected and job.state == "COMPLETED":
        logs = here.run_sub_logs()
        if logs:
            atomic_write_bytes(here.adopted_log, b"".join(p.read_bytes() for p in logs))
            return here.adopted_log
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
