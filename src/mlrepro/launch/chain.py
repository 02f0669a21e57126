"""A seed's attempts one after another, and a pretraining seed as a chain of time-limited jobs.

Every seed runs here as attempts under one policy (mlrepro.launch.attempt): each ended attempt gets
its class, and the seed goes on or ends by it, one budget of failed attempts for retries and segments
alike. A benchmark with a `segments:` block gives its trainer a checkpoint folder (the seed's
checkpoints/) and, when a job limit applies (the benchmark's job_seconds or the system's
max_job_minutes, the shorter), that limit and a margin: the trainer stops `margin` before the limit
(or when SIGUSR1 comes, `save_signal_seconds` before it), writes a checkpoint and ends without
run_stop, printing a `segment: {json}` line. The chain runs segment after segment until the run's log
has run_stop. Its state is on disk in the seed's folder (segments.json and the checkpoints), so a
workflow killed between segments goes on where it was when run again; a segment that dies without a
checkpoint (SIGKILL, scancel, a hang stopped by the watch) is followed by one that resumes from the
last good checkpoint, and a checkpoint found damaged, or that a resume dies loading, is set aside.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mlrepro import paths
from mlrepro.formats import checkpoints
from mlrepro.launch import attempt
from mlrepro.launch.job import SeedFailed, now, record_failure
from mlrepro.paths import SeedPaths
from mlrepro.slurm import node_health
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)

SEGMENT_LINE = re.compile(r"\bsegment: (\{.*\})\s*$", re.MULTILINE)
RUN_STOP = re.compile(r':::MLLOG .*"key": "run_stop"')


@dataclass(frozen=True)
class Limits:
    job_seconds: float | None  # None: no limit, the seed is one job (still checkpointed)
    margin_seconds: float
    save_signal_seconds: float = 0  # SIGUSR1 this long before the limit (0: the trainer's margin alone)

    @property
    def training_seconds(self) -> float | None:
        """What one job of the chain trains: its limit less the margin the trainer stops before it; None: no limit."""
        return self.job_seconds - self.margin_seconds if self.job_seconds else None


def limits(segments: dict | None, max_job_minutes: float | None) -> Limits | None:
    """The job limit a benchmark's seeds run under on a system; None for a benchmark that does not checkpoint."""
    if segments is None:
        return None
    candidates = [v for v in (segments.get("job_seconds"), max_job_minutes and 60.0 * max_job_minutes) if v]
    job = min(candidates) if candidates else None
    return Limits(job, float(segments.get("margin_seconds", 0)),
                  float(segments.get("save_signal_seconds", 0)) if job else 0.0)


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


def run_seed(plan, system, run_log: Path, launch_one: Callable, lim: Limits | None, retries: int,
             finish: Callable[[], None] | None = None) -> dict:
    """Attempts of the seed, each `launch_one(plan, system, run_log)` (the local or Slurm backend chosen by
    mlrepro.launch.auto), until one finishes or the attempt policy (mlrepro.launch.attempt) ends the seed.

    A checkpointing seed (`lim` given) is a chain: each attempt resumes from the last good checkpoint,
    and every one is recorded in segments.json with its class, steps, GPU-seconds and the work it lost.
    `finish()` takes a finished attempt's log as the seed's result (kinds' finish_seed); a SeedFailed it
    raises is one more failed attempt. A failure the backend says no retry can mend (changed inputs,
    leftover processes, a full disk, the early stop, a divergence) ends the seed at once, as before.
    Returns the chain's state ({"segments": []} for a seed that is not chained)."""
    files = SeedPaths(plan.seed_dir)
    chained = lim is not None
    state = read_state(plan.seed_dir) if chained else {"segments": []}
    folder = files.checkpoints
    budget = attempt.Budget(retries)
    set_aside_once = False
    while True:
        if chained:
            _set_aside_damaged(folder)
        before, started, started_at = _step(folder) if chained else 0, time.monotonic(), now()
        # The previous attempt's log must not speak for one that dies before writing its own (every
        # attempt keeps its own log in attempt_K/).
        run_log.parent.mkdir(parents=True, exist_ok=True)
        run_log.write_text("")
        failure, refused, decided_elsewhere = None, None, False
        try:
            launch_one(plan, system, run_log)
        except SeedFailed as exc:
            failure = paths.read_json_if_exists(files.failure) or {}
            if not exc.retry and failure.get("state") != "CANCELLED":
                raise
            failure["message"] = str(exc)
            # A cancel made while an earlier invocation ran was not this one's decision: it is retried.
            decided_elsewhere = exc.retry
        text = run_log.read_text(errors="replace") if run_log.exists() else ""
        said = segment_record(text) or {}
        backend_state = "COMPLETED" if failure is None else failure.get("state", "FAILED")
        cls = attempt.classify(attempt.Ended(
            backend_state, text, finished=finished(text), saved_at_limit=said.get("status") == "resume",
            node_side=node_health.node_side(backend_state, text), exit_code=(failure or {}).get("exit_code")))
        if failure is not None and cls == attempt.FINISHED:
            # The backend's word that the attempt failed (a node found bad at its end, say) outweighs a
            # run_stop in its log: retried, as before; only an attempt whose log finish() took is a result.
            cls = attempt.FAILED_MID_RUN
        if failure is None and finish is not None and (cls == attempt.FINISHED or not chained):
            try:
                finish()
                cls = attempt.FINISHED  # the kind took the log as the run's result (a Megatron log has no run_stop)
            except SeedFailed as exc:
                if not exc.retry:
                    raise
                refused = exc
                failure = paths.read_json_if_exists(files.failure) or {"message": str(exc)}
                cls = attempt.FAILED_MID_RUN if cls == attempt.FINISHED else cls
        after = (said.get("to_step", _step(folder)) if cls == attempt.FINISHED else _step(folder)) if chained else 0
        failed = cls not in attempt.NOT_FAILURES
        # A run killed mid-way has no last words of its own; one that never trained a step says why in any words.
        errors = (attempt.error_lines(text, strict=cls != attempt.FAILED_BEFORE_FIRST_STEP)
                  if failed and cls != attempt.HUNG else [])
        sig = attempt.signature(text) if failed else None
        recovered = None
        if (cls == attempt.FAILED_BEFORE_FIRST_STEP and chained and before and not set_aside_once
                and _LOAD_ERROR.search("\n".join(errors))):
            # A resume that dies loading its checkpoint: that checkpoint is set aside once, the previous one used.
            recovered = checkpoints.set_aside(folder, before)
            set_aside_once = recovered is not None
            after = _step(folder)
        record = _record(
            len(state["segments"]) + 1, said, started=started_at, ended=now(), from_step=before, to_step=after,
            wall_s=round(time.monotonic() - started, 3), status=said.get("status") or "killed",
            error=(failure or {}).get("message") or (failure or {}).get("reason"),
            **_attempt_fields(plan, cls, text, after, errors, sig, recovered,
                              (failure or {}).get("reason") or (failure or {}).get("message"), before))
        record["gpu_s"] = round(record["wall_s"] * getattr(plan, "ranks", 1), 1)
        record["attempt"] = files.attempts()[-1].number if files.attempts() else None
        _mark_attempt(files, cls)
        if chained:
            state["segments"].append(record)
            atomic_write_json(files.segments, state)
        verdict = budget.after(cls, sig, progressed=chained and after > before, chained=chained or decided_elsewhere,
                               recovered=recovered is not None)
        if cls == attempt.FINISHED and refused is None:
            return state
        if not verdict.go_on:
            reason = f"{attempt.DESCRIPTIONS[cls]} ({verdict.reason})" if verdict.reason != "cancelled" else None
            if reason:
                why = (failure or {}).get("reason") or record["error"]
                reason = f"{reason}: {why}" if why else reason
                kept = {k: v for k, v in (failure or {}).items() if k not in ("reason", "time", "message")}
                record_failure(plan.seed_dir, reason, **{
                    **kept, "state": kept.get("state", backend_state), "class": cls, "error_lines": errors,
                    "signature": sig, "attempts": budget.history})
            raise SeedFailed(f"seed {plan.seed}: {reason or (failure or {}).get('message') or 'cancelled'}"
                             + ("\n  " + "\n  ".join(errors[-5:]) if errors else ""), retry=False)
        if failure is not None and chained:
            # The chain goes on: the segment's record keeps why it ended, and the seed is not "failed".
            files.failure.unlink(missing_ok=True)
        if failure is not None:
            log.warning("seed %s: attempt %s %s; %s", plan.seed, record.get("attempt") or "", attempt.DESCRIPTIONS[cls],
                        "the chain goes on from the last good checkpoint" if chained else "retrying")


# What a trainer says when the checkpoint it resumes from cannot be read.
_LOAD_ERROR = re.compile(r"load|checkpoint|unpickl|PytorchStreamReader|EOFError|zip archive|corrupt", re.IGNORECASE)


def _set_aside_damaged(folder: Path) -> None:
    """Checkpoints whose files are not what was written (mlrepro.formats.checkpoints.problems) are set aside
    before an attempt would resume from them, newest first, each named in the log."""
    while (last := checkpoints.latest(folder)) is not None and (found := checkpoints.problems(last)):
        aside = checkpoints.set_aside(folder, last.step)
        log.warning("checkpoint of step %d set aside as %s (%s); resuming from the one before", last.step, aside,
                    "; ".join(found))


def _attempt_fields(plan, cls: str, text: str, saved: int, errors: list[str], sig: str | None,
                    set_aside: Path | None, reason: str | None = None, from_step: int = 0) -> dict:
    """What a segment's record adds about the attempt: its class, the work it lost since the last save
    (steps trained past it, and their seconds at the attempt's own pace), its error; and what its
    effective training time is measured from (mlrepro.scoring.goodput): the last step it trained, its
    steady seconds per step, its checkpoint writes where the trainer times them, how long a hang went on."""
    steps = [s for s in attempt.steps_in(text) if s >= 0]
    trained = _trained_steps(text)
    lost_steps = max(0, trained[-1][0] - saved) if trained and cls != attempt.FINISHED else 0
    pace = sum(t for _, t in trained[-5:]) / len(trained[-5:]) if trained else None
    writes = checkpoint_writes(text)
    fields = {"class": cls, "lost_steps": lost_steps,
              "lost_s": round(lost_steps * pace, 1) if pace is not None and lost_steps else 0.0,
              "steps_seen": len(steps), "last_step": trained[-1][0] if trained else None,
              "step_s": steady_step_seconds(trained, [step for step, _ in writes]),
              "stepping_s": stepping_seconds(trained, from_step),
              "checkpoint_writes": len(writes), "checkpoint_write_s": round(sum(s for _, s in writes), 3),
              "checkpoint_steps": [step for step, _ in writes]}
    if cls == attempt.HUNG:
        fields["hang_s"] = attempt.hung_for(reason)
    if errors:
        fields.update(error_lines=errors, signature=sig)
    if set_aside is not None:
        fields["set_aside"] = str(set_aside)
    return fields


# A trainer's step lines with the seconds a step took: mini_gpt's iter_s, Megatron-LM's elapsed ms.
_TIMED_STEP = re.compile(r"progress: step (\d+)/\d+ .*?iter_s ([\d.]+)"
                         r"|\biteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")


def _trained_steps(text: str) -> list[tuple[int, float]]:
    """(step, seconds per step) of each new step line of a log (after a resume's marker)."""
    resumed = None
    for resumed in attempt.RESUMED.finditer(text):
        pass
    found = []
    for m in _TIMED_STEP.finditer(text, resumed.end() if resumed else 0):
        if m.group(1):
            found.append((int(m.group(1)), float(m.group(2))))
        else:
            found.append((int(m.group(3)), float(m.group(4)) / 1000))
    return found


# A trainer's word that it wrote a checkpoint, and how long the write took: mini_gpt's line; Megatron-LM's and
# Megatron-DeepSpeed's "successfully saved checkpoint from/at iteration N", timed by the save-checkpoint timer
# they print after it ((min, max) over the ranks, in ms).
CHECKPOINT_LINE = re.compile(r"checkpoint: step (\d+) written in ([\d.]+) s")
MEGATRON_SAVED = re.compile(r"successfully saved checkpoint (?:from|at) iteration\s+(\d+)")
MEGATRON_SAVE_TIMER = re.compile(r"save-checkpoint\s*\.*:\s*\(([\d.]+),\s*([\d.]+)\)")


def checkpoint_writes(text: str) -> list[tuple[int, float]]:
    """(step, seconds) of each checkpoint the attempt's log says it wrote (a Megatron save with no timer after
    it, before the next save: 0 s, the write still counted)."""
    writes = [(int(m.group(1)), float(m.group(2))) for m in CHECKPOINT_LINE.finditer(text)]
    saves = list(MEGATRON_SAVED.finditer(text))
    for m, after in zip(saves, [*(x.start() for x in saves[1:]), len(text)]):
        timer = MEGATRON_SAVE_TIMER.search(text, m.end(), after)
        writes.append((int(m.group(1)), float(timer.group(2)) / 1000 if timer else 0.0))
    return writes


def steady_step_seconds(trained: list[tuple[int, float]], written_at: list[int]) -> float | None:
    """The attempt's steady seconds per step: the median over its timed step lines, leaving out the
    intervals that hold a checkpoint write (counted apart), and the first, which may hold a warm-up.
    mini_gpt times every tenth step over the ten before it, so its evaluations (every ten steps) stay in."""
    previous = [None, *(step for step, _ in trained[:-1])]
    steady = [t for (step, t), before in zip(trained, previous)
              if before is not None and not any(before <= w < step for w in written_at)]
    steady = steady or [t for _, t in trained]
    return round(statistics.median(steady), 6) if steady else None


def stepping_seconds(trained: list[tuple[int, float]], from_step: int) -> float | None:
    """Seconds the attempt spent from its first step to its last timed one, checkpoint writes and
    evaluations included: each timed line's seconds a step x the steps since the line before (the first
    since `from_step`, where the attempt began)."""
    if not trained:
        return None
    previous = [from_step, *(step for step, _ in trained[:-1])]
    return round(sum(t * max(0, step - before) for (step, t), before in zip(trained, previous)), 3)


def _mark_attempt(files: SeedPaths, cls: str) -> None:
    """The latest attempt's attempt.json says its class (written by its backend; never fails the seed)."""
    attempts = files.attempts()
    if not attempts:
        return
    record_path = attempts[-1].record
    record = paths.read_json_if_exists(record_path)
    if record is not None:
        with contextlib.suppress(OSError):
            atomic_write_json(record_path, {**record, "class": cls})


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
