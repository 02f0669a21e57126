"""What mlrepro checks in a run's log beyond the official MLPerf tools: plausible times and one run per log.

mlperf_logging's compliance checker and result_summarizer take run_stop - run_start as they find it
and never compare one run with another. A log can then claim a negative or astronomic run time,
count an evaluation stamped after the run ended, or be one run copied under several seeds. These
checks refuse such runs; every reason they give says that mlrepro is stricter than the official
tools here, so a submitter knows the official checker would have let the run through.

The functions take MLLOG records (mlrepro.scoring.mllog.Record, or `event_of` an mlperf_logging
LogLine) or run records (score_run's dicts) and give reasons; the scorer decides what a reason costs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from mlrepro.scoring.mllog import finite

STRICTER = "mlrepro is stricter than mlperf_logging here"
# MLLOG's time_ms is Unix time in milliseconds: a run logged before 2000 or after 2100 has a clock
# that cannot be trusted (or an edited log).
EARLIEST_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
LATEST_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z


@dataclass(frozen=True)
class Event:
    """The fields of an MLLOG record these checks read (mlrepro.scoring.mllog.Record has them too)."""

    key: str
    time_ms: float
    value: Any
    metadata: dict
    lineno: int


def event_of(logline) -> Event:
    """An mlperf_logging parser LogLine (timestamp, key, value {'value', 'metadata'}, lineno) as an Event,
    for a scorer that reads logs with the official parser."""
    value = logline.value if isinstance(logline.value, dict) else {}
    metadata = value.get("metadata")
    return Event(logline.key, logline.timestamp, value.get("value"), metadata if isinstance(metadata, dict) else {},
                 logline.lineno)


def implausible_time(time_ms: Any) -> bool:
    value = finite(time_ms)
    return value is None or not EARLIEST_MS <= value <= LATEST_MS


def run_time_problems(start, stop) -> list[str]:
    """Why run_start/run_stop do not make a run time (empty when they do); both records present."""
    why = []
    for rec in (start, stop):
        if implausible_time(rec.time_ms):
            why.append(f"{rec.key} (line {rec.lineno}) is stamped at time_ms {rec.time_ms:g}, not a time between "
                       f"2000 and 2100 ({STRICTER})")
    if not why and stop.time_ms <= start.time_ms:
        why.append(f"run_stop (line {stop.lineno}) is not after run_start (line {start.lineno})")
    return why


def outside_run(records: Iterable, start, stop) -> list:
    """The records logged between run_start and run_stop whose time is not between theirs."""
    return [r for r in records if not start.time_ms <= r.time_ms <= stop.time_ms]


def evaluations_in_time(window: Sequence, metric: str, start, stop) -> tuple[list, list[str]]:
    """The records of the window that count as evaluations of `metric`, and a problem for each left out.

    An evaluation stamped before run_start or after run_stop is not part of the timed run, wherever
    its line stands; evaluations must also follow each other in time."""
    kept, problems = [], []
    last = None
    for rec in window:
        if rec.key != metric:
            continue
        if start is not None and stop is not None and not start.time_ms <= rec.time_ms <= stop.time_ms:
            when = "after run_stop" if rec.time_ms > stop.time_ms else "before run_start"
            problems.append(f"{metric} at line {rec.lineno} is stamped {when}; not counted ({STRICTER})")
            continue
        if last is not None and rec.time_ms < last.time_ms:
            problems.append(f"{metric} at line {rec.lineno} is stamped before the one at line {last.lineno}; "
                            f"not counted ({STRICTER})")
            continue
        kept.append(rec)
        last = rec
    return kept, problems


def loss_problems(records: Iterable, metric: str) -> list[str]:
    """Why evaluations of `metric`, a loss (its target is a value to get below), cannot be believed:
    a value below zero or not finite. No loss is negative (cross-entropy, perplexity's log, an error
    rate), and one that is would meet any target below; the Megatron-LM path refuses the same
    (validation_problems). Empty when every value can be a loss."""
    why = []
    for rec in records:
        if rec.key != metric or isinstance(rec.value, bool) or not isinstance(rec.value, (int, float)):
            continue
        value = finite(rec.value)
        if value is None or value < 0:
            why.append(f"{metric} {json.dumps(rec.value)} at line {rec.lineno} is not a loss (negative or not "
                       f"finite): the log is corrupt; not scored ({STRICTER})")
    return why


MIN_FINGERPRINT_EVALS = 3


def fingerprint(evals: Sequence, start, stop) -> str | None:
    """What makes a run itself: its evaluation curve (samples, value) and when each evaluation and
    run_stop came, relative to run_start. Two real runs never share it to the millisecond; a log copied
    with its seed edited (or dropped, or its clock shifted) does. None with fewer than MIN_FINGERPRINT_EVALS
    evaluations: two sleeps of a short synthetic run can land on the same milliseconds in different
    runs (seen on the local cluster: 2 of 24 such runs), three timings of real training never do."""
    if len(evals) < MIN_FINGERPRINT_EVALS or start is None or stop is None:
        return None
    points = [[r.metadata.get("samples_count"), r.value, r.time_ms - start.time_ms] for r in evals]
    text = json.dumps([points, stop.time_ms - start.time_ms], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def mark_duplicates(runs: list[dict], exclude: bool = True) -> None:
    """Mark each run that repeats an earlier one, with the reason: the same MLLOG records, the same
    evaluation curve and timing (`fingerprint`), or the same seed. With `exclude` it is not counted
    either; without (runs MLCommons' summarizer scored: it counts every file) the copy stays in the
    score and the result is made not valid by the count of distinct runs."""
    tail = "; not scored" if exclude else "; the summarizer counts it, so the result is not valid"
    same_log: dict[str, str] = {}
    same_curve: dict[str, str] = {}
    seeds: dict[Any, str] = {}
    for run in runs:
        run["duplicate"] = False
        why = None
        sha, curve, seed = run.get("mllog_sha256"), run.get("fingerprint"), run.get("seed")
        if sha and sha in same_log:
            why = f"identical to {same_log[sha]} (the same MLLOG records){tail}"
        elif curve and curve in same_curve:
            why = (f"the same run as {same_curve[curve]}: the same evaluations at the same times after "
                   f"run_start, whatever seed it logs{tail} ({STRICTER})")
        elif seed is not None and seed in seeds:
            why = f"duplicate seed {seed} (also in {seeds[seed]}){tail}"
        if why:
            run["duplicate"] = True
            run["counted"] = run.get("counted", False) and not exclude
            if exclude:  # a copy that is not scored did not converge either: no reader need parse the reason
                run["converged"] = False
            run.setdefault("reasons", []).append(why)
            continue
        if sha:
            same_log[sha] = run.get("file")
        if curve:
            same_curve[curve] = run.get("file")
        if seed is not None:
            seeds[seed] = run.get("file")


def untrusted_time(run: dict) -> str | None:
    """Why a run record's `minutes` cannot be a run time (None when it can): every record, whichever
    parser wrote it and whenever (a run.json of an older version), is checked before it is averaged."""
    minutes = run.get("minutes")
    if minutes is None:
        return None
    value = finite(minutes)
    if value is None or value <= 0:
        return f"run time {minutes!r} minutes is not a positive number; not scored"
    return None


# ---------------------------------------------------------------- Megatron-LM / NeMo logs
# No official tool reads these logs; mlrepro scores them, so these rules are mlrepro's own.


def training_log_problems(log) -> list[str]:
    """Why a parsed training log (mlrepro's megatron_log.TrainingLog) cannot be timed as one run:
    more than one start of training, iterations that go back or whose stamps go back, a start of
    training stamped after an iteration. Empty when it reads as one run in order."""
    why = []
    starts = getattr(log, "starts", None) or ([log.start] if log.start is not None else [])
    if len(starts) > 1:
        why.append(f"log holds more than one run: {len(starts)} '[before the start of training step]' lines; "
                   f"not scored")
    totals = sorted({it.train_iters for it in log.iterations if it.train_iters is not None})
    if len(totals) > 1:
        why.append(f"log holds more than one run: iterations count to {' and '.join(map(str, totals))}; not scored")
    previous = None
    for it in log.iterations:
        if previous is not None and it.iteration <= previous.iteration:
            why.append(f"iteration goes back from {previous.iteration} to {it.iteration}: the log holds more than "
                       f"one run or its lines are out of order; not scored")
            break
        if previous is not None and it.time is not None and previous.time is not None and it.time < previous.time:
            why.append(f"iteration {it.iteration} is stamped before iteration {previous.iteration}: lines out of "
                       f"order; not scored")
            break
        previous = it
    after = getattr(log, "start_after_iteration", None)
    if after is not None:
        why.append(f"the start of training is logged after iteration {after}: lines out of order; not scored")
    first = next((it for it in log.iterations if it.time is not None), None)
    if log.start is not None and first is not None and log.start > first.time:
        why.append(f"the start of training ({log.start}) is stamped after iteration {first.iteration} "
                   f"({first.time}); not scored")
    return why


def validation_problems(log) -> list[str]:
    """Why a validation cannot be believed: a loss that is not positive (a language model's
    cross-entropy is), a validation of an iteration the log never reaches, validations out of order."""
    why = []
    last_logged = max((it.iteration for it in log.iterations), default=None)
    if getattr(log, "training_done", False) and last_logged is not None:
        # the loop ran to --train-iters: its end-of-training validation is at an iteration left unlogged
        last_logged = max([last_logged, *(it.train_iters for it in log.iterations if it.train_iters)])
    previous = None
    for v in log.validations:
        if not v.loss > 0:
            why.append(f"validation at iteration {v.iteration}: lm loss {v.loss:g} is not a positive number; "
                       f"the log is corrupt")
        if previous is not None and v.iteration < previous:
            why.append(f"validation at iteration {v.iteration} follows one at iteration {previous}: out of order")
        if last_logged is not None and v.iteration > last_logged:
            why.append(f"validation at iteration {v.iteration}: the log never reaches that iteration")
        previous = v.iteration
    return why


def training_fingerprint(log) -> str | None:
    """A training log's validations and the time of each logged iteration after the start of training:
    the same in a copy of the log, whatever seed it names. None without validations."""
    if not log.validations:
        return None
    start = log.start
    stamps = [(it.iteration, (it.time - start).total_seconds() if it.time is not None and start is not None else None,
               it.lm_loss) for it in log.iterations]
    text = json.dumps([[[v.iteration, v.loss] for v in log.validations], stamps], default=repr)
    return hashlib.sha256(text.encode()).hexdigest()
