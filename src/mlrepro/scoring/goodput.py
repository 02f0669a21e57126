"""Effective training time, measured: how much of the time a seed's attempts ran went into training it,
and where the rest went.

MegaScale (NSDI'24) defines the effective training time rate as productive iterations x iteration time
÷ total time. Here, per seed:

    productive steps      the steps of the run, each counted once: how far its last attempt got
    step time             the steady seconds per step: each attempt's median over its timed step lines,
                          checkpoint writes left out (mlrepro.launch.chain records it), for the steps it
                          added; the seed's is their mean over its productive steps
    total time            the elapsed time of every attempt (attempt.json: sacct's on Slurm); the time a
                          job queued is not in it and is shown apart

and the rest of the total is lost, by cause:

    redone                work trained after the last save and lost with the attempt (segments.json's
                          lost_s), and steps trained again after a damaged checkpoint was set aside
    restart and start-up  each attempt's time that was not spent on steps: start-up, loading the
                          checkpoint, the end (elapsed - the seconds its timed step lines add up to - a hang)
    hang                  a hung attempt's time without progress, until the watch stopped it
    failed attempts       attempts that never trained a step: all their time
    checkpoint writes     where the trainer times its writes (mini_gpt does)
    unattributed          what is left (+ or -): each attempt's own pace against the seed's steady one

so that productive + the causes = the total. A benchmark's figures are its seeds' summed. The
functions are pure (records in, figures out) but `seed_goodput_of` and `benchmark_goodput`, which read a
seed folder's segments.json and attempt.json files. The measured restart and checkpoint costs are what
a failure model's expected effective time (Young/Daly) is given.
"""

from __future__ import annotations

import datetime as dt
import html
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence

from mlrepro import paths
from mlrepro.paths import SeedPaths
from mlrepro.scoring import cost

# The causes of lost time, in the order the tables show them, with what a reader sees.
CAUSES = {
    "redone": "work redone since the last save",
    "restart": "restart and start-up",
    "hang": "hang until detected",
    "failed_attempts": "failed attempts",
    "checkpoint": "checkpoint writes",
    "unattributed": "unattributed",
}
FINISHED = "finished"
# Classes of attempts whose whole time is lost when they trained no step (mlrepro.launch.attempt).
_NO_STEP_CLASSES = {"failed_before_first_step"}


def _time_s(text: str | None) -> float | None:
    try:
        t = dt.datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None
    return None if t is None else (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def queue_seconds(attempt: dict) -> float | None:
    """How long an attempt's job waited before it ran (Slurm: sacct's start - submit); None where unknown."""
    submitted, started = _time_s(attempt.get("submitted")), _time_s(attempt.get("start"))
    return max(0.0, started - submitted) if submitted is not None and started is not None else None


def step_seconds(segments: Sequence[dict]) -> float | None:
    """The median of the attempts' own steady seconds per step (chain.steady_step_seconds): the pace of an
    attempt that timed none of its steps."""
    found = [s["step_s"] for s in segments if s.get("step_s")]
    return statistics.median(found) if found else None


def attempt_losses(segments: Sequence[dict], attempts: Sequence[dict]) -> list[dict]:
    """Each attempt's time split into productive seconds and lost seconds by cause (see the module).

    Productive seconds are the attempt's new steps at its own steady step time (a shared machine's speed
    changes between attempts: the steps are counted at the pace they were trained); its restart and
    start-up is what its timed steps and a hang leave of its elapsed time; what the steady pace and the
    timed lines disagree on is unattributed."""
    step_s = step_seconds(segments) or 0.0
    by_number = {a.get("attempt"): a for a in attempts}
    rows, high = [], 0
    for seg in segments:
        att = by_number.get(seg.get("attempt"), {})
        elapsed = att.get("elapsed_s")
        elapsed = float(elapsed if elapsed is not None else seg.get("wall_s") or 0.0)
        start, end = int(seg.get("from_step") or 0), int(seg.get("to_step") or 0)
        last = seg.get("last_step")
        last = int(last) if last is not None else end + int(seg.get("lost_steps") or 0)
        new = max(0, end - max(start, high))
        again = max(0, min(end, high) - start)  # steps trained again after a set-aside checkpoint
        lost = {cause: 0.0 for cause in CAUSES}
        if (last <= start and seg.get("class") != FINISHED) or seg.get("class") in _NO_STEP_CLASSES:
            lost["failed_attempts"] = elapsed
            new = 0
        else:
            pace = float(seg.get("step_s") or step_s)
            lost["redone"] = float(seg.get("lost_s") or 0.0) + again * pace
            lost["hang"] = float(seg.get("hang_s") or 0.0)
            lost["checkpoint"] = float(seg.get("checkpoint_write_s") or 0.0)
            stepping = seg.get("stepping_s")  # its timed lines' own seconds, writes included
            stepping = float(stepping) if stepping is not None else max(0, last - start) * pace + lost["checkpoint"]
            # What was not stepping or hanging: starting, loading, the end (and, for an attempt killed,
            # its steps after its last timed line).
            lost["restart"] = max(0.0, elapsed - stepping - lost["hang"])
            lost["unattributed"] = elapsed - new * pace - sum(lost.values())
        high = max(high, end)
        productive = new * float(seg.get("step_s") or step_s)
        rows.append({"attempt": seg.get("attempt"), "class": seg.get("class"), "from_step": start, "to_step": end,
                     "elapsed_s": round(elapsed, 3), "queue_s": queue_seconds(att), "productive_s": round(productive, 3),
                     "new_steps": new,
                     "lost_s": {k: round(v, 3) for k, v in lost.items()}, "resumed": start > 0})
    return rows


def seed_goodput(segments: Sequence[dict], attempts: Sequence[dict], run_seconds: float | None = None) -> dict | None:
    """A seed's effective training time and its lost time by cause, from its segments.json records and its
    attempts' attempt.json records (mlrepro.scoring.cost.seed_attempts); None for a seed with no attempt.

    A seed that ran as one job (no segments: a benchmark that does not checkpoint) has no step records:
    its productive time is its run's own time (`run_seconds`, run_start to run_stop), and every attempt
    before the last is a failed attempt (each started from nothing)."""
    if not attempts and not segments:
        return None
    if segments:
        rows = attempt_losses(segments, attempts)
        steps = max((int(s.get("to_step") or 0) for s in segments), default=0)
        new = sum(r["new_steps"] for r in rows)
        step_s = sum(r["productive_s"] for r in rows) / new if new else step_seconds(segments)
        finished = segments[-1].get("class") == FINISHED or segments[-1].get("status") == "success"
    else:
        rows, step_s, steps = _unchained(attempts, run_seconds), None, None
        finished = run_seconds is not None
    total = sum(r["elapsed_s"] for r in rows)
    productive = sum(r["productive_s"] for r in rows)
    lost = {cause: sum(r["lost_s"][cause] for r in rows) for cause in CAUSES}
    queues = [r["queue_s"] for r in rows if r["queue_s"] is not None]
    return {
        "effective": productive / total if total > 0 else None,
        "productive_s": round(productive, 3), "total_s": round(total, 3),
        "queue_s": round(sum(queues), 3) if queues else None,
        "lost_s": {k: round(v, 3) for k, v in lost.items()},
        "productive_steps": steps, "step_s": step_s, "finished": finished,
        "attempts": len(rows), "failures": sum(1 for r in rows if r["class"] not in (FINISHED, "saved_at_limit")),
        "startup_s": start_up_cost(rows), "restart_cost_s": restart_cost(rows),
        "checkpoint_cost_s": checkpoint_cost(segments), "checkpoint_interval_steps": checkpoint_interval(segments),
        "per_attempt": rows,
    }


def _unchained(attempts: Sequence[dict], run_seconds: float | None) -> list[dict]:
    rows = []
    for i, att in enumerate(attempts):
        elapsed = float(att.get("elapsed_s") or 0.0)
        lost = {cause: 0.0 for cause in CAUSES}
        last = i == len(attempts) - 1 and run_seconds is not None
        productive = min(elapsed, run_seconds) if last else 0.0
        if last:
            lost["restart"] = elapsed - productive
        else:
            lost["failed_attempts"] = elapsed
        rows.append({"attempt": att.get("attempt"), "class": att.get("class") or (FINISHED if last else None),
                     "from_step": None, "to_step": None, "elapsed_s": round(elapsed, 3), "queue_s": queue_seconds(att),
                     "productive_s": round(productive, 3), "new_steps": None, "lost_s": lost, "resumed": False})
    return rows


def start_up_cost(rows: Sequence[dict]) -> float | None:
    """Seconds from the seed's first attempt's start to its first step (and its end): the start-up."""
    first = next((r for r in rows if not r["resumed"] and not r["lost_s"]["failed_attempts"]), None)
    return first["lost_s"]["restart"] if first else None


def restart_cost(rows: Sequence[dict]) -> float | None:
    """The measured restart cost R: the median time an attempt that resumed from a checkpoint took to
    start, load and end around its steps (attempt_losses' rows), of those that ended on their own where
    there are some (a killed attempt's steps after its last timed line count in its own); None where no
    attempt resumed."""
    resumed = [r for r in rows if r["resumed"] and not r["lost_s"]["failed_attempts"]]
    whole = [r for r in resumed if r["class"] in (FINISHED, "saved_at_limit")] or resumed
    return statistics.median(r["lost_s"]["restart"] for r in whole) if whole else None


def checkpoint_cost(segments: Sequence[dict]) -> float | None:
    """The measured checkpoint write cost δ: seconds per write, where the trainer timed its writes."""
    writes = sum(int(s.get("checkpoint_writes") or 0) for s in segments)
    return sum(float(s.get("checkpoint_write_s") or 0.0) for s in segments) / writes if writes else None


def checkpoint_interval(segments: Sequence[dict]) -> int | None:
    """The steps between checkpoints the run chose (mini_gpt's CKPT_EVERY): the most common gap between
    consecutive writes of one attempt (a write at a job's limit falls between)."""
    gaps = [b - a for s in segments for a, b in zip(s.get("checkpoint_steps") or [], (s.get("checkpoint_steps") or [])[1:])]
    return statistics.mode(gaps) if gaps else None


def run_pace(runs: Sequence[dict]) -> tuple[float | None, int | None]:
    """(seconds per step, steps) of a benchmark's runs as their records (run.json's, or a reference's scored
    runs) give them: each converged run's steps are its samples to converge / its global batch, its pace
    its time / those steps (evaluations included: they are in the time a save interval spans); the
    medians. (None, None) where no run says both."""
    paces, steps = [], []
    for run in runs:
        samples, gbs, minutes = run.get("samples_to_converge"), run.get("global_batch_size"), run.get("minutes")
        if samples and gbs and minutes:
            steps.append(samples / gbs)
            paces.append(minutes * 60 / steps[-1])
    return (statistics.median(paces), round(statistics.median(steps))) if paces else (None, None)


def seed_goodput_of(folder: Path, gpus_per_node: int = 1) -> dict | None:
    """seed_goodput of a seed folder: its segments.json, its attempts and its run's time (run.json), with the
    checkpoint interval its plan chose (plan.json's checkpoint_interval: {steps, seconds, chosen_by}) as
    `planned_interval`."""
    files = SeedPaths(folder)
    segments = (paths.read_json_if_exists(files.segments) or {}).get("segments") or []
    attempts = cost.seed_attempts(folder, gpus_per_node)
    run = paths.read_json_if_exists(files.run_json) or {}
    minutes = run.get("minutes")
    g = seed_goodput(segments, attempts, minutes * 60 if isinstance(minutes, (int, float)) else None)
    if g is not None:
        g["planned_interval"] = (paths.read_plan(folder) or {}).get("checkpoint_interval")
    return g


def total(per_seed: Iterable[dict]) -> dict | None:
    """A benchmark's effective training time: its seeds' productive and total times and causes summed."""
    seeds = [g for g in per_seed if g]
    if not seeds:
        return None
    t, p = sum(g["total_s"] for g in seeds), sum(g["productive_s"] for g in seeds)
    queues = [g["queue_s"] for g in seeds if g["queue_s"] is not None]
    return {"effective": p / t if t > 0 else None, "productive_s": round(p, 3), "total_s": round(t, 3),
            "queue_s": round(sum(queues), 3) if queues else None,
            "lost_s": {c: round(sum(g["lost_s"][c] for g in seeds), 3) for c in CAUSES},
            "attempts": sum(g["attempts"] for g in seeds), "failures": sum(g["failures"] for g in seeds),
            "restart_cost_s": _median(g["restart_cost_s"] for g in seeds),
            "checkpoint_cost_s": _median(g["checkpoint_cost_s"] for g in seeds),
            "checkpoint_interval_steps": _median(g["checkpoint_interval_steps"] for g in seeds),
            "step_s": _median(g["step_s"] for g in seeds),
            # the newest seed's: each seed's plan priced failures with the costs measured before it
            "planned_interval": next((g["planned_interval"] for g in reversed(seeds) if g.get("planned_interval")),
                                     None)}


def _median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def benchmark_goodput(benchmark_folder: Path, gpus_per_node: int = 1) -> dict | None:
    """score.json's `goodput`: per seed (by seed number) and for the benchmark; None before any attempt."""
    seeds = {str(seed): g for seed, folder in sorted(paths.seed_dirs(Path(benchmark_folder)).items())
             if (g := seed_goodput_of(folder, gpus_per_node))}
    summed = total(seeds.values())
    return {**summed, "seeds": seeds} if summed else None


# ---------------------------------------------------------------- as the user reads it


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def lost_words(g: dict) -> str:
    """'redone 3.1 s, restart and start-up 9.0 s, ...': the causes that lost time, in seconds."""
    parts = [f"{CAUSES[c]} {g['lost_s'][c]:.1f} s" for c in CAUSES if abs(g["lost_s"].get(c) or 0) >= 0.05]
    return ", ".join(parts) or "none"


SUMMARY_COLUMNS = ("effective_training_time", "productive_s", "attempts_total_s",
                   *(f"lost_{c}_s" for c in CAUSES), "queued_s")


def summary_columns(verdict: dict) -> dict:
    """The effective training time columns of one benchmark's row in summary.csv (its verdict.json's)."""
    g = verdict.get("goodput") or {}
    lost = g.get("lost_s") or {}
    return {"effective_training_time": g.get("effective"), "productive_s": g.get("productive_s"),
            "attempts_total_s": g.get("total_s"), **{f"lost_{c}_s": lost.get(c) for c in CAUSES},
            "queued_s": g.get("queue_s")}


def status_line(name: str, g: dict) -> str:
    """One line of `mlrepro status`: the effective training time and where the rest went."""
    queue = f"; queued {g['queue_s']:.1f} s apart" if g.get("queue_s") else ""
    return (f"{name}: effective training time {percent(g['effective'])} ({g['productive_s']:.1f} s productive of "
            f"{g['total_s']:.1f} s in {g['attempts']} attempt(s)); lost: {lost_words(g)}{queue}")


def interval_words(g: dict) -> str:
    """'checkpoint interval 20 steps (12.4 s at 0.620 s a step); planned 20 steps (Young/Daly)': what the
    seeds measured and what their plan chose."""
    interval, planned = g.get("checkpoint_interval_steps"), g.get("planned_interval")
    words = (f"checkpoint interval {interval if interval is not None else '-'} steps"
             + (f" ({interval * g['step_s']:.1f} s at {g['step_s']:.3f} s a step)" if interval and g.get("step_s") else ""))
    if planned:
        steps = planned.get("steps")
        words += "; planned " + (f"{steps} steps" if steps is not None else "the implementation's own") + \
            f" ({planned.get('chosen_by')})"
    return words


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def section(score: dict) -> str:
    """The report's section: the effective training time per seed and in all, the lost time by cause,
    the measured restart and checkpoint costs and the checkpoint interval; and, where score.json carries
    one (`goodput.predicted`), the prediction beside the measurement."""
    g = score.get("goodput")
    if not g:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h in ("seed", "effective", "productive (s)", "total (s)",
                                                 *(f"{CAUSES[c]} (s)" for c in CAUSES), "queued, apart (s)"))
    rows = []
    for name, s in [*sorted((g.get("seeds") or {}).items(), key=lambda kv: int(kv[0])), ("all", g)]:
        cells = [_e(name), percent(s["effective"]), _s(s["productive_s"]), _s(s["total_s"]),
                 *(_s(s["lost_s"][c]) for c in CAUSES), _s(s.get("queue_s"))]
        rows.append(f"<tr{' class=total' if name == 'all' else ''}>" + "".join(
            f"<td class='{'num' if i else ''}'>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    facts = [f"restart cost {_s(g.get('restart_cost_s'))} s (median of the attempts that resumed)",
             f"checkpoint write {_s(g.get('checkpoint_cost_s'))} s"
             + ("" if g.get("checkpoint_cost_s") is not None else " (the trainer does not time its writes)"),
             interval_words(g)]
    predicted = g.get("predicted")
    verdict = ""
    if predicted:
        verdict = (f"<p id='goodput-predicted'>measured {percent(g['effective'])}, predicted "
                   f"{percent(predicted.get('effective'))} ({_e(predicted.get('method'))})</p>")
    return ("<h2 id='goodput'>Effective training time</h2>"
            f"<p id='goodput-effective'>effective training time {percent(g['effective'])}: "
            f"{_s(g['productive_s'])} s of {_s(g['total_s'])} s trained the run, over {g['attempts']} attempts "
            f"({g['failures']} ended by a failure)</p>" + verdict +
            f"<div class='scroll'><table id='goodput-table'><tr>{head}</tr>{''.join(rows)}</table></div>"
            f"<p class='small' id='goodput-costs'>{_e('; '.join(facts))}. Effective = productive steps x the steady "
            "step time ÷ the elapsed time of every attempt (MegaScale's rate); the time jobs queued is not in it.</p>")
