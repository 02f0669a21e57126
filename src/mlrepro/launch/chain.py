"""A pretraining seed as a chain of time-limited jobs, each resuming from the last checkpoint.

A benchmark with a `segments:` block gives its trainer a checkpoint folder (the seed's
checkpoints/) and, when a job limit applies (the benchmark's job_seconds or the system's
max_job_minutes, the shorter), that limit and a margin: the trainer stops `margin` before the
limit, writes a checkpoint and ends without run_stop, printing a `segment: {json}` line. The
chain runs segment after segment (each one an attempt of the seed, submitted by mlrepro.launch)
until the run's log has run_stop. Its state is on disk in the seed's folder (segments.json and
the checkpoints), so a workflow killed between segments goes on where it was when run again; a
segment that dies without a checkpoint (SIGKILL, scancel) is followed by one that resumes from
the last good checkpoint. `max_stalls` segments in a row without a new checkpoint fail the seed.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mlrepro import paths
from mlrepro.launch.job import SeedFailed, now, record_failure
from mlrepro.formats import checkpoints
from mlrepro.paths import SeedPaths
from mlrepro.util.fsutil import atomic_write_json

SEGMENT_LINE = re.compile(r"\bsegment: (\{.*\})\s*$", re.MULTILINE)
RUN_STOP = re.compile(r':::MLLOG .*"key": "run_stop"')


@dataclass(frozen=True)
class Limits:
    job_seconds: float | None  # None: no limit, the seed is one job (still checkpointed)
    margin_seconds: float
    max_stalls: int


def limits(segments: dict | None, max_job_minutes: float | None) -> Limits | None:
    """The job limit a benchmark's seeds run under on a system; None for a benchmark that does not checkpoint."""
    if segments is None:
        return None
    candidates = [v for v in (segments.get("job_seconds"), max_job_minutes and 60.0 * max_job_minutes) if v]
    return Limits(min(candidates) if candidates else None, float(segments.get("margin_seconds", 0)),
                  int(segments.get("max_stalls", 2)))


def run_env(lim: Limits, seed_dir: Path) -> dict[str, str]:
    """What the trainer is told: where to checkpoint, and the job's limit and margin."""
    env = {"CHECKPOINT_DIR": str(SeedPaths(seed_dir).checkpoints)}
    if lim.job_seconds:
        env.update(JOB_SECONDS=f"{lim.job_seconds:g}", MARGIN_SECONDS=f"{lim.margin_seconds:g}")
    return env


def walltime_minutes(lim: Limits, config_minutes: int) -> int:
    """A segment's scheduler wall-time: the job limit (whole minutes, as Slurm counts), else the config's."""
    return max(1, math.ceil(lim.job_seconds / 60)) if lim.job_seconds else config_minutes


def segment_record(log_text: str) -> dict | None:
    """The trainer's last `segment: {...}` line: status, from_step, to_step, train_s, wall_s, val_loss."""
    found = SEGMENT_LINE.findall(log_text)
    if not found:
        return None
    try:
        return json.loads(found[-1])
    except ValueError:
        return None


# What a segment's record takes from the segment's own `segment:` line (where the line has it): a
# record matching the line on these is that segment's, which take_back relies on.
FROM_LINE = ("status", "from_step", "train_s", "val_loss")


def _record(index: int, said: dict, **seen) -> dict:
    """A segments.json record: what the segment's line says, over what was `seen` from outside it."""
    record = dict.fromkeys(("index", "started", "ended", "from_step", "to_step", "wall_s", "train_s", "val_loss",
                            "status", "error"))
    record.update(index=index, **seen)
    record.update({key: said[key] for key in FROM_LINE if said.get(key) is not None})
    return record


def finished(log_text: str) -> bool:
    return RUN_STOP.search(log_text) is not None


def read_state(seed_dir: Path) -> dict:
    try:
        state = json.loads(SeedPaths(seed_dir).segments.read_text())
    except (FileNotFoundError, ValueError):
        return {"segments": []}
    return state if isinstance(state.get("segments"), list) else {"segments": []}


def _step(folder: Path) -> int:
    return checkpoints.latest_step(folder)


class ChainStalled(RuntimeError):
    """Segments in a row ended without a new checkpoint: the chain would not get anywhere."""


def run_chain(seed_dir: Path, run_log: Path, run_segment: Callable[[], None], lim: Limits,
              failures: tuple[type[BaseException], ...] = ()) -> dict:
    """Run segments until the run's log (run_log, the last segment's) has run_stop; the chain's state.

    `run_segment` launches one job and returns when it ends; an exception in `failures` (a failed
    or killed job) ends that segment, and the next one resumes from the last good checkpoint.
    """
    files = SeedPaths(seed_dir)
    state = read_state(seed_dir)
    folder = files.checkpoints
    stalls = 0
    while True:
        before, started, started_at, error = _step(folder), time.monotonic(), now(), None
        # The previous segment's log must not speak for a job that dies before writing its own
        # (every attempt keeps its own log in attempt_K/).
        run_log.parent.mkdir(parents=True, exist_ok=True)
        run_log.write_text("")
        try:
            run_segment()
        except failures as exc:
            error = exc
        text = run_log.read_text(errors="replace") if run_log.exists() else ""
        said = segment_record(text) or {}
        done = finished(text)
        after = said.get("to_step", _step(folder)) if done else _step(folder)
        state["segments"].append(_record(
            len(state["segments"]) + 1, said, started=started_at, ended=now(), from_step=before, to_step=after,
            wall_s=round(time.monotonic() - started, 3), status=None if said else "killed",
            error=str(error) if error else None))
        atomic_write_json(files.segments, state)
        if done:
            return state
        stalls = stalls + 1 if after <= before else 0
        if stalls > lim.max_stalls:
            raise ChainStalled(f"{seed_dir.name}: {stalls} segment(s) in a row ended without a new checkpoint "
                               f"(last at step {after}); last error: {error or 'none'}") from error


def take_back(seed_dir: Path, run_log: Path) -> bool:
    """The segment of run_log, the latest attempt's log taken back after the workflow died
    (mlrepro.launch.adopt), recorded if the workflow died before it could be (its training time counts);
    True if it has the run's end: the chain is then over and nothing is trained again."""
    text = run_log.read_text(errors="replace") if run_log.exists() else ""
    state, said = read_state(seed_dir), segment_record(text)
    last = state["segments"][-1] if state["segments"] else {}
    if said and any(said.get(key) is not None and last.get(key) != said[key] for key in FROM_LINE):
        state["segments"].append(_record(len(state["segments"]) + 1, said, to_step=said.get("to_step"),
                                         wall_s=said.get("wall_s")))
        atomic_write_json(SeedPaths(seed_dir).segments, state)
    return finished(text)


def summary(seed_dir: Path) -> list[dict]:
    """The seed's segments for its run record and report (empty for a seed that ran as one job)."""
    return read_state(seed_dir)["segments"]


class SegmentEnded(RuntimeError):
    """A segment's job failed or was killed; the chain goes on from the last good checkpoint."""


def run_seed(plan, system, run_log: Path, launch_one: Callable, lim: Limits) -> dict:
    """The seed's chain, each segment launched by `launch_one(plan, system, run_log)` (the local or
    Slurm backend, chosen by mlrepro.launch.auto). A failure that retrying cannot mend (changed inputs,
    leftover processes, a full disk) still fails the seed; a cancelled or crashed job is one more segment."""
    def segment() -> None:
        try:
            launch_one(plan, system, run_log)
        except SeedFailed as exc:
            failure = SeedPaths(plan.seed_dir).failure
            why = (paths.read_json_if_exists(failure) or {}).get("state")
            if not exc.retry and why != "CANCELLED":
                raise
            # The chain goes on: the segment's record keeps why it ended, and the seed is not "failed".
            failure.unlink(missing_ok=True)
            raise SegmentEnded(f"{exc} [{why}]") from exc

    try:
        return run_chain(plan.seed_dir, run_log, segment, lim, failures=(SegmentEnded,))
    except ChainStalled as exc:
        record_failure(plan.seed_dir, str(exc), state="STALLED")
        raise SeedFailed(str(exc)) from None
