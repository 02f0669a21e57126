"""Score training runs the way MLCommons scores them.

Per run (``score_run``): run time = run_stop − run_start of the first such
records, in minutes; convergence from run_stop's status and the target; the
official compliance checker of the benchmark's ruleset.

Per benchmark (``score_runs``), following mlperf_logging 4.1's result_summarizer
and rcp_checker: runs that fail (compliance, parse errors, no run_start/stop,
not converged) are dropped; at most one may fail and it then counts as the
dropped slowest run; the olympic mean drops the fastest and slowest of the
rest (10 runs → mean of the middle 8, 3 → the median); the RCP check compares
the olympic mean of samples-to-converge with the reference convergence points
and scales the score by max(1, RCP mean / submission mean) when the check
passes. For an MLPerf benchmark all of this is scoring.engine, the engine tree
mode uses too: a published folder gets the factor the summarizer applies (its
scaling.json), a reproduction's own runs the factor their RCP check gives now.

A benchmark without an MLPerf ruleset (mini_lora) gets the generic checks:
run_start and run_stop present, status success, target met. A log without MLLOG
that holds Megatron-LM or NeMo training lines is scored by scoring.megatron_score
into the same record. The rules applied come from scoring.rules.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from mlrepro.scoring import checkers, engine, integrity, megatron_log, megatron_score, official
from mlrepro.scoring.mllog import ParsedLog, Record, contains_mllog, finite, parse_log, parse_text
from mlrepro.scoring.records import ABSENT, MLLOG, OFFICIAL, RunRecord, ScoreRecord
from mlrepro.scoring.rules import MLPERF_TARGETS, Rules


# ---------------------------------------------------------------- one run


def _logged_seed(log: ParsedLog) -> int | None:
    """The seed the run logged (`mlrepro score` on loose files); the workflow passes the seed instead."""
    rec = log.first("seed")
    if rec is not None:
        try:
            return int(rec.value)
        except (TypeError, ValueError, OverflowError):
            pass
    return None


def _number(x: Any) -> float | None:
    """`x` if it is a number a float can hold (ints stay ints), else None."""
    return None if finite(x) is None else x


def _lines(records: Sequence[Record]) -> str:
    return ", ".join(str(r.lineno) for r in records[:5]) + (", ..." if len(records) > 5 else "")


# Benchmarks whose published logs hold a seed of each rank, a different value on each (Quanta's ssd
# logs seed + rank, its stable_diffusion one drawn per rank): there several seeds are one run. The
# other implementations log the seed once (rank 0), so a second value there is a second run. Two
# ranks' seeds and two runs' seeds read alike, so for these benchmarks a second seed alone proves
# nothing: a repeated run_start or evaluations going back still do.
SEED_PER_RANK = frozenset({"ssd", "stable_diffusion"})


def _mixed_runs(log: ParsedLog, window: Sequence[Record], metric: str, seeds: bool = True) -> list[str]:
    """Why the log holds more than one run (empty when it holds one).

    Two runs in one log happen when an earlier attempt's ranks outlive it and keep
    writing: run_start/run_stop repeat, or, when the old run has not reached its end,
    its evaluations interleave with the new run's and their sample counts go back.
    With `seeds` False, different seeds do not count (SEED_PER_RANK).
    """
    why = []
    starts, stops = log.all("run_start"), log.all("run_stop")
    if len(starts) > 1 or len(stops) > 1:
        why.append(f"log holds more than one run: {len(starts)} run_start (lines {_lines(starts)}), "
                   f"{len(stops)} run_stop (lines {_lines(stops)}); not scored")
    logged = {json.dumps(r.value, sort_keys=True) for r in log.all("seed")} if seeds else set()
    if len(logged) > 1:
        why.append(f"log holds more than one run: {len(logged)} different seeds logged "
                   f"(lines {_lines(log.all('seed'))}); not scored")
    previous = None
    for rec in window:
        samples = finite(rec.metadata.get("samples_count")) if rec.key == metric else None
        if samples is None:
            continue
        if previous is not None and samples < previous[0]:
            why.append(f"log holds more than one run: {metric} samples_count goes back from {previous[0]:g} "
                       f"(line {previous[1]}) to {samples:g} (line {rec.lineno}); not scored")
            break
        previous = (samples, rec.lineno)
    return why


def _timed_window(log: ParsedLog, reasons: list[str]) -> tuple[Any, Any, list, float | None]:
    """run_start, run_stop, the records between them and the minutes between them (None, with the
    reason added to `reasons`, when they do not make a run time)."""
    start, stop = log.first("run_start"), log.first("run_stop")
    position = {id(r): i for i, r in enumerate(log.records)}
    first = position[id(start)] + 1 if start is not None else len(log.records)
    last = position[id(stop)] if stop is not None else len(log.records)
    # Only what the run logged between run_start and run_stop counts, by its time stamp as the
    # official tools read it: the ranks of one run print their lines in no fixed order, so where
    # a line stands in the file does not say when it happened.
    # Without run_stop (a run killed or still going), what follows run_start's line is the run.
    window = log.records[first:] if stop is None else [] if start is None else [
        r for r in log.records if r is not start and r is not stop and start.time_ms <= r.time_ms <= stop.time_ms]
    minutes = None
    if start is None:
        reasons.append("run_start missing")
    if stop is None:
        reasons.append("run_stop missing")
    if start is not None and stop is not None:
        why = integrity.run_time_problems(start, stop)
        if last < first and not why:
            why = ["run_stop is logged before run_start"]
        reasons.extend(why)
        # Same arithmetic as result_summarizer, so the rounding matches too.
        minutes = None if why else (stop.time_ms - start.time_ms) / 60 / 1000
    return start, stop, window, minutes


def _evaluation_lines(log: ParsedLog, start: Any, stop: Any, window: list) -> list:
    """Where a run's evaluations are looked for: every line when run_start and run_stop are both
    logged (their time stamps decide, and one stamped outside the run is named), else the window."""
    return log.records if start is not None and stop is not None else window


def _refusals(log: ParsedLog, window: Sequence[Record], evaluated: Sequence[Record], rules: Rules,
               benchmark: str | None, seeds: bool = True) -> list[str]:
    """Why the run is not scored whatever the official tools say: a log of another benchmark, more
    than one run in the log, a loss no model has. Such a run is neither counted nor converged."""
    why = []
    expected = {rules.benchmark, rules.mlperf_benchmark} - {None}
    if benchmark is not None and benchmark not in expected:
        why.append(f"log is for benchmark {benchmark}, not {rules.mlperf_benchmark or rules.benchmark}; not scored")
    why += _mixed_runs(log, window, rules.target_metric, seeds=seeds)
    if rules.target_direction == "<=" and rules.target_value is not None:
        why += integrity.loss_problems(evaluated, rules.target_metric)
    return why


def _evaluations(window: list, metric: str) -> tuple[list[list[float]], float | None]:
    """[samples, value] of each evaluation of `metric` in the window, and the last sample count
    logged with one (samples-to-converge, as rcp_checker reads it)."""
    evals: list[list[float]] = []
    last_samples = None
    for rec in window:
        if rec.key != metric:
            continue
        samples = _number(rec.metadata.get("samples_count"))
        value = _number(rec.value)
        if samples is not None:
            last_samples = samples
        if value is not None:
            evals.append([samples, value])
    return evals, last_samples


def score_run(log_path: str | os.PathLike, rules: Rules, *, run_compliance: bool = True,
              seed: int | None = None) -> dict:
    """run_record's JSON (run.json's content), for callers that read records as dicts."""
    return run_record(log_path, rules, run_compliance=run_compliance, seed=seed).to_json()


def _status(stop: Any) -> str | None:
    status = stop.metadata.get("status") if stop is not None else None
    return status if isinstance(status, str) else None


def run_record(log_path: str | os.PathLike, rules: Rules, *, run_compliance: bool = True,
               seed: int | None = None) -> RunRecord:
    """Score one run's log. Never raises on bad log content.

    The run record (run.json): file, seed, benchmark, minutes, status, converged, target_reached,
    samples_to_converge, global_batch_size, evals, compliance {checked, pass, reasons}, counted,
    reasons, problems, mllog_sha256, fingerprint.
    """
    path = Path(log_path)
    if rules.target_direction == "<=" and not contains_mllog(path) and megatron_log.is_training_log(path):
        # A pretraining run that logs no MLLOG: the same record, from Megatron-LM's/NeMo's own lines.
        return megatron_score.training_record(path, target_loss=rules.target_value, seed=seed,
                                              benchmark=rules.benchmark)
    if rules.mlperf_benchmark and run_compliance:
        return _official_run(path, rules, seed)
    log = parse_log(path)
    reasons: list[str] = []

    logged_bench = log.value("submission_benchmark")
    benchmark = logged_bench if isinstance(logged_bench, str) else None

    start, stop, window, minutes = _timed_window(log, reasons)
    timed, late = integrity.evaluations_in_time(_evaluation_lines(log, start, stop, window), rules.target_metric,
                                                start, stop)
    refused = _refusals(log, window, timed, rules, benchmark)
    if refused:
        reasons.extend(refused)
        minutes = None
    status = _status(stop)
    if stop is not None and status != "success":
        reasons.append(f"run_stop status is {status or 'missing'}, not success")

    evals, last_samples = _evaluations(timed, rules.target_metric)
    target_reached = any(rules.target_met(v) for _, v in evals)
    if not evals:
        reasons.append(f"no {rules.target_metric} evaluation logged")
    elif not target_reached:
        best = (min if rules.target_direction == "<=" else max)(v for _, v in evals)
        reasons.append(f"target {rules.target_metric} {rules.target_direction} {rules.target_value:g} not reached "
                       f"(best {best:g})")
    gbs = log.last("global_batch_size")

    if rules.mlperf_benchmark and run_compliance:
        verdict = _compliance_of(log, rules)
        if verdict.checked and not verdict.passed:
            reasons.append("compliance checker failed")
    elif rules.mlperf_benchmark:
        verdict = checkers.Verdict(False, None, ["compliance check skipped"])
    else:
        verdict = checkers.Verdict(False, None, [f"no MLPerf ruleset for {rules.benchmark}: generic checks only"])
    return RunRecord(
        scorer=MLLOG, file=str(path), seed=seed if seed is not None else _logged_seed(log), benchmark=benchmark,
        minutes=minutes, status=status, evals=evals, target_reached=target_reached,
        converged=status == "success" and target_reached and not refused,
        samples_to_converge=last_samples if status == "success" else None,
        global_batch_size=_number(gbs.value) if gbs is not None else None,
        compliance=verdict.to_dict(), counted=not reasons, reasons=reasons, problems=list(log.problems) + late,
        # Two files with the same MLLOG records are one run, whatever their names say; and so are two
        # with the same evaluations at the same times after run_start, whatever seed they log.
        mllog_sha256=hashlib.sha256(log.to_bytes()).hexdigest() if log.records else None,
        fingerprint=integrity.fingerprint(timed, start, stop))


def _official_run(path: Path, rules: Rules, seed: int | None) -> RunRecord:
    """run_record for an MLPerf benchmark: whether and how long the run counts is result_summarizer's
    verdict on the log (scoring.engine); the record around it is read from the same lines. What the
    official tools do not check is flagged, and the result is not valid. A log that is not one run
    of this benchmark (_refusals) or whose run time we refuse (run_stop not after run_start) is not
    counted here though they count it: the score then differs from MLCommons' on a result that is
    not valid either way, and no record says "not scored" of a run it counts."""
    with official.official_tools():
        read = engine.read_run(path, usage=rules.usage, ruleset=rules.ruleset)
    converged, epochs = engine.submission_epochs(read["lines"], rules.ruleset)
    log = parse_text("".join(ln + "\n" for ln in read["lines"]), source=str(path))
    logged_bench = log.value("submission_benchmark")
    benchmark = logged_bench if isinstance(logged_bench, str) else None
    timing: list[str] = []
    start, stop, window, _ = _timed_window(log, timing)
    status = _status(stop)
    timed, late = integrity.evaluations_in_time(_evaluation_lines(log, start, stop, window), rules.target_metric,
                                                start, stop)
    refused = _refusals(log, window, timed, rules, benchmark, seeds=rules.mlperf_benchmark not in SEED_PER_RANK)
    flags = list(refused)
    evals, _ = _evaluations(timed, rules.target_metric)
    # The compliance checker holds runs to the target (its ATLEAST_ONE_CHECK), two-part ones too.
    target_reached = (any(rules.target_met(v) for _, v in evals) if rules.target_value is not None
                      else bool(read["compliance"]["pass"]))
    run_converged = status == "success" and target_reached and not refused
    if read["counted"] and not refused and not run_converged:
        why = (f"run_stop status is {status or 'missing'}" if status != "success" else
               f"no {rules.target_metric} evaluation stamped within the run meets the target")
        flags.append(f"the official tools count this run, but it did not converge: {why} ({integrity.STRICTER})")
    gbs = log.last("global_batch_size")
    return RunRecord(
        scorer=OFFICIAL, file=str(path), seed=seed if seed is not None else _logged_seed(log), benchmark=benchmark,
        minutes=read["minutes"], time_ms=read["time_ms"], status=status, evals=evals, target_reached=target_reached,
        converged=run_converged, samples_to_converge=epochs if converged else None,
        global_batch_size=_number(gbs.value) if gbs is not None else None, compliance=read["compliance"],
        counted=read["counted"] and not timing and not refused, flags=flags, reasons=timing + read["reasons"] + flags,
        problems=read["problems"] + list(log.problems) + late,
        mllog_sha256=hashlib.sha256(log.to_bytes()).hexdigest() if log.records else None,
        fingerprint=integrity.fingerprint(timed, start, stop))


def _compliance_of(log: ParsedLog, rules: Rules) -> checkers.Verdict:
    """Run the official checker on the clean MLLOG text of the run."""
    if not log.records:
        return checkers.Verdict(True, False, ["no MLLOG records"])
    tmp = Path(tempfile.mkdtemp(prefix="mlrepro-run-"))
    try:
        clean = tmp / "result_0.txt"
        clean.write_bytes(log.to_bytes())
        return checkers.check_compliance(clean, ruleset=rules.ruleset, usage=rules.usage)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- many runs


def olympic_mean(minutes: Sequence[float], failed: int, max_failed: int = 1) -> float | None:
    """result_summarizer's olympic average.

    `minutes` are the run times of the runs that count; `failed` runs were
    dropped already and stand for the slowest ones. The fastest `max_failed`
    and the slowest (max_failed − failed) are dropped and the rest averaged.
    None when too many failed or nothing is left.
    """
    if failed > max_failed:
        return None
    scores = sorted(minutes)
    countable = scores[max_failed:len(scores) - (max_failed - failed)]
    if not countable:
        return None
    return sum(countable) * 1.0 / len(countable)


def _rcp_of(distinct: list[dict], rules: Rules, reasons: list[str]) -> dict:
    """The RCP check of the runs (MLPerf benchmarks), its failure added to `reasons`."""
    if rules.mlperf_benchmark:
        rcp = checkers.check_rcp(
            [checkers.RcpRun(r.get("status") == "success", _rcp_samples(r, rules), r.get("global_batch_size"))
             for r in distinct],
            benchmark=rules.mlperf_benchmark, ruleset=rules.ruleset, usage=rules.usage)
        if rcp["checked"] and not rcp["pass"]:
            reasons.append(f"RCP check failed: {rcp['reason']}")
        elif not rcp["checked"]:
            reasons.append(f"RCP check not possible: {rcp['reason']}")
    else:
        rcp = {"checked": False, "pass": None, "scaling_factor": 1.0,
               "reason": f"no MLPerf ruleset for {rules.benchmark}: no reference convergence points"}
    return rcp


def score_runs(log_paths: Iterable[str | os.PathLike], rules: Rules, *,
               runs: Sequence[RunRecord | dict] | None = None, run_compliance: bool = True) -> dict:
    """score_records's JSON (score.json's content), for callers that read records as dicts.

    `runs` may hold precomputed run records (e.g. read back from each seed's run.json) so
    compliance is not run twice; otherwise each log in `log_paths` is scored here.
    """
    if runs is None:
        records = [run_record(p, rules, run_compliance=run_compliance) for p in log_paths]
    else:
        records = [RunRecord.of(r) for r in runs]
    return score_records(records, rules).to_json()


def reproduction_score(run_files: Iterable[str | os.PathLike], rules: Rules, *, cost: dict,
                       running_verdict: dict, complete_mlperf_result: bool,
                       early_stop: dict | None = None, goodput: dict | None = None) -> ScoreRecord:
    """A reproduction's score.json: its seeds' run records (run.json) scored together, with what the
    reproduction cost, its running verdict, its effective training time (scoring.goodput) and, when the
    early stop settled it, that decision."""
    score = score_records([RunRecord.read(p) for p in run_files], rules)
    reasons = list(score.reasons)
    if early_stop is not None:
        reasons.insert(0, early_stop["message"])
    changed = [{"seed": r.seed if r.seed is not ABSENT else None, **r.changed_after_finish}
               for r in score.runs if r.changed_after_finish]
    return score.replace(valid=score.valid and early_stop is None, reasons=reasons, cost=cost,
                         running_verdict=running_verdict, complete_mlperf_result=complete_mlperf_result,
                         early_stop=early_stop if early_stop is not None else ABSENT,
                         changed_after_finish=changed or ABSENT,
                         goodput=goodput if goodput is not None else ABSENT)


def score_records(records: Sequence[RunRecord], rules: Rules) -> ScoreRecord:
    """Score a set of runs of one benchmark: the score (score.json)."""
    # integrity's checks mark copies of the runs' JSON, read back into the score's runs at the end.
    runs = [dict(r.to_json(), reasons=list(r.reasons or [])) for r in records]
    reasons: list[str] = []
    # Runs the official tools scored (_official_run): the score is the summarizer's, over every
    # run it counts; what it does not check makes the result not valid.
    official_runs = bool(rules.mlperf_benchmark) and all(r.scorer == OFFICIAL for r in records)

    for run in runs:
        why = integrity.untrusted_time(run)
        if why:
            run["counted"], run["converged"], run["minutes"] = False, False, None
            run["reasons"].append(why)
    integrity.mark_duplicates(runs, exclude=not official_runs)
    distinct = [r for r in runs if not r["duplicate"]]
    pool = runs if official_runs else distinct
    counted = [r for r in pool if r.get("counted") and r.get("minutes") is not None]
    failed = [r for r in pool if r not in counted]
    reasons += [f"{_run_name(r)}: {flag}" for r in runs for flag in r.get("flags") or []]

    if not runs:
        reasons.append("no runs found")
    if len(distinct) < rules.required_runs:
        reasons.append(f"{len(distinct)} distinct runs, {rules.benchmark} needs {rules.required_runs}")
    elif rules.mlperf_benchmark and len(distinct) > rules.required_runs:
        reasons.append(f"{len(distinct)} runs, MLPerf {rules.mlperf_benchmark} takes exactly {rules.required_runs}")
    if len(failed) > rules.max_failed_runs:
        names = ", ".join(_run_name(r) for r in failed)
        reasons.append(f"{len(failed)} runs failed or did not converge ({names}); at most "
                       f"{rules.max_failed_runs} allowed")
    olympic = olympic_mean([r["minutes"] for r in counted], len(failed), rules.max_failed_runs)
    if olympic is None and len(failed) <= rules.max_failed_runs and runs:
        reasons.append("not enough runs left for an olympic mean")

    found = engine.runs_rcp(runs, rules.usage, rules.ruleset, len(failed), rules.max_failed_runs, reasons) \
        if official_runs else None
    if found is None:  # no MLPerf ruleset, compliance skipped, or only the run records left (run.json)
        rcp = _rcp_of(distinct, rules, reasons)
        rcp.setdefault("recomputed_factor", rcp["scaling_factor"])
        found = rcp, {"value": None, "note": None}
    rcp, energy = found
    score = olympic * rcp["scaling_factor"] if olympic is not None else None
    return ScoreRecord(
        benchmark=rules.benchmark, mlperf_benchmark=rules.mlperf_benchmark, ruleset=rules.ruleset,
        required_runs=rules.required_runs, target=rules.target,
        runs=[RunRecord.from_json(run, scorer=r.scorer) for run, r in zip(runs, records)],
        runs_counted=len(counted), runs_failed=len(failed), olympic_minutes=olympic, rcp=rcp, score_minutes=score,
        energy=energy, valid=score is not None and not reasons, reasons=reasons,
        tools={"mlperf_logging": checkers.mlperf_logging_version()})


def _rcp_samples(run: dict, rules: Rules) -> Any:
    """What the RCP check counts for a run: samples for the LLM benchmarks (as score_run reads
    them), and for the others what rcp_checker.read_submission_file reads from the log
    (epochs for most, the first passing evaluation for stable_diffusion)."""
    if rules.mlperf_benchmark in MLPERF_TARGETS or run.get("status") != "success" or not run.get("file"):
        return run.get("samples_to_converge")
    try:
        lines = official.mllog_lines(run["file"])  # as given: no working directory is changed here
    except OSError:  # a log it cannot read: the run's own count stands
        return run.get("samples_to_converge")
    converged, epochs = engine.submission_epochs(lines, rules.ruleset)
    return epochs if converged else None


def _run_name(run: dict) -> str:
    return f"seed {run['seed']}" if run.get("seed") is not None else Path(str(run.get("file"))).name
