"""What a reproduction costs: GPU-hours planned and spent, per attempt, seed and benchmark.

Spent: every attempt of every seed counts, failed, cancelled, timed-out and diverged ones
included: nodes x GPUs per node x elapsed. Each attempt folder (results/<b>/seed_<N>/attempt_<K>/)
holds attempt.json, written by the launch backend when the attempt ends:

    {"attempt": K, "scheduler": "local" | "slurm", "job_id", "nodes": 1, "node_names": [...],
     "gpus_per_node": 2, "start": iso, "end": iso, "elapsed_s": 41.0, "state": "COMPLETED",
     "energy_j": null, "source": "sacct" | "local clock", "submitted": iso}

("submitted": a Slurm job's submission, sacct's; its start less that is the time it queued.)

On Slurm the elapsed time, node list and state are sacct's (ElapsedRaw, NodeList, State) and
energy its ConsumedEnergyRaw where the cluster gathers it; locally they are the attempt's own
clock. Seed folders written before attempt.json existed are read from job.json (the current
attempt) and, for earlier attempts, from the times of the attempt folder's files; such figures
are marked "estimated".

Planned (the dry run): seeds x nodes x GPUs x the configured wall-time is the upper bound (a seed
never runs longer; retries not counted), and where a reference exists, seeds x nodes x GPUs x the
reference runs' mean run time is the expected cost (run_start to run_stop: the start-up of each
job comes on top).

On a CPU system a "GPU" is a rank (one core each), and the unit reads CPU-hours.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path
from typing import Iterable, Sequence

from mlrepro import paths
from mlrepro.paths import JobRecord, SeedPaths

COMPLETED = "COMPLETED"
RUNNING = "RUNNING"
# Not ended: neither spent in full nor failed (a pending Slurm job costs nothing yet).
LIVE = {RUNNING, "PENDING"}


def unit(device: str | None) -> str:
    """GPU-hours, or CPU-hours where the ranks are CPU cores."""
    return "CPU-hours" if device == "cpu" else "GPU-hours"


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        t = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def attempt_record(attempt: int, scheduler: str, *, nodes: int, gpus_per_node: int, start: str | None,
                   end: str | None = None, elapsed_s: float | None = None, state: str = RUNNING,
                   job_id: str | None = None,
                   node_names: Sequence[str] = (), energy_j: float | None = None, source: str = "local clock",
                   reason: str | None = None, device: str | None = None, submitted: str | None = None) -> dict:
    """attempt.json's content (the backend writes it; see the module's docstring)."""
    if elapsed_s is None and start and end:
        s, e = _parse_time(start), _parse_time(end)
        elapsed_s = max((e - s).total_seconds(), 0.0) if s and e else None
    return {"attempt": attempt, "scheduler": scheduler, "job_id": job_id, "nodes": int(nodes),
            "node_names": list(node_names), "gpus_per_node": int(gpus_per_node), "start": start, "end": end,
            "elapsed_s": elapsed_s, "state": state, "energy_j": energy_j, "source": source, "device": device,
            **({"reason": reason} if reason else {}), **({"submitted": submitted} if submitted else {})}


def gpu_hours(record: dict) -> float:
    """nodes x GPUs per node x elapsed hours of one attempt (0 when its elapsed time is unknown)."""
    return record.get("nodes", 1) * record.get("gpus_per_node", 0) * (record.get("elapsed_s") or 0) / 3600


def _folder_times(folder: Path) -> tuple[dt.datetime, dt.datetime] | None:
    """First and last modification among an attempt folder's files: its run, roughly."""
    times = [p.stat().st_mtime for p in folder.rglob("*") if p.is_file()]
    if not times:
        return None
    def utc(t): return dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return utc(min(times)), utc(max(times))


def _estimated(folder: Path, number: int, job: JobRecord, failure: dict, gpus_per_node: int,
               now: dt.datetime) -> dict | None:
    """An attempt without attempt.json (a seed folder from before it existed)."""
    current = job.attempt == number
    span = _folder_times(folder)
    if current and job.scheduler == "slurm" and job.elapsed_s is not None:
        nodes = list(job.nodes or ())
        return {**attempt_record(number, "slurm", nodes=len(nodes) or 1, gpus_per_node=gpus_per_node,
                                 start=job.submitted, end=job.end, elapsed_s=float(job.elapsed_s),
                                 state=job.state or "UNKNOWN", job_id=job.job_id, node_names=nodes,
                                 source=SeedPaths.JOB), "estimated": False}
    if span is None:
        return None
    start = _parse_time(job.submitted) if current else None
    start = start or span[0]
    end = span[1]
    failed_here = failure.get("attempt") == number
    state = failure.get("state", "FAILED") if failed_here else (
        COMPLETED if SeedPaths(folder.parent).mllog.exists() and current else "UNKNOWN")
    ranks = job.ranks if current and job.scheduler == "local" else None
    return {**attempt_record(number, job.scheduler or "local", nodes=1,
                             gpus_per_node=ranks or gpus_per_node, start=_iso(start), end=_iso(end),
                             elapsed_s=max((end - start).total_seconds(), 0.0), state=state,
                             job_id=job.job_id or None if current else None,
                             source="folder times"), "estimated": True}


def seed_attempts(seed_folder: Path, gpus_per_node: int, now: dt.datetime | None = None) -> list[dict]:
    """Every attempt of one seed, oldest first, each with its gpu_hours.

    A running attempt (attempt.json says RUNNING with no end) counts up to `now`.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    job = paths.read_job(seed_folder) or JobRecord()
    failure = paths.read_failure(seed_folder) or {}
    found = []
    for here in SeedPaths(seed_folder).attempts():
        child, number = here.folder, here.number
        record = paths.read_json_if_exists(here.record)
        if record is not None:
            record = dict(record)
            if record.get("state") == RUNNING and not record.get("end") and (s := _parse_time(record.get("start"))):
                record["elapsed_s"] = max((now - s).total_seconds(), 0.0)
            record.setdefault("estimated", False)
        else:
            record = _estimated(child, number, job, failure, gpus_per_node, now)
        if record is not None:
            record["gpu_hours"] = gpu_hours(record)
            found.append(record)
    return sorted(found, key=lambda r: r["attempt"])


def seed_cost(attempts: Sequence[dict]) -> dict:
    """One seed's GPU-hours: in all, on attempts that did not complete, and energy where all report it."""
    spent = sum(a["gpu_hours"] for a in attempts)
    failed = sum(a["gpu_hours"] for a in attempts if a.get("state") not in (COMPLETED, *LIVE))
    energy = [a.get("energy_j") for a in attempts]
    return {"gpu_hours": spent, "failed_gpu_hours": failed, "attempts": len(attempts),
            "failed_attempts": sum(a.get("state") not in (COMPLETED, *LIVE) for a in attempts),
            "elapsed_s": sum(a.get("elapsed_s") or 0 for a in attempts),
            "energy_kwh": sum(energy) / 3.6e6 if energy and all(e is not None for e in energy) else None,
            "estimated": any(a.get("estimated") for a in attempts)}


def planned(seeds: int, nodes: int, gpus_per_node: int, walltime_minutes: float,
            reference_minutes: Iterable[float] = ()) -> dict:
    """The dry run's figures: upper bound at the wall-time, expected from the reference's run times."""
    ranks = nodes * gpus_per_node
    ref = [m for m in reference_minutes if m is not None]
    mean = statistics.fmean(ref) if ref else None
    return {"seeds": seeds, "nodes": nodes, "gpus_per_node": gpus_per_node, "walltime_minutes": walltime_minutes,
            "upper_bound_gpu_hours": seeds * ranks * walltime_minutes / 60,
            "expected_gpu_hours": seeds * ranks * mean / 60 if mean is not None else None,
            "reference_mean_minutes": mean}


def benchmark_cost(benchmark_folder: Path, gpus_per_node: int, plan: dict | None = None,
                   now: dt.datetime | None = None) -> dict:
    """Spent (per seed and in all) beside planned, for score.json, summary.csv, the reports and status."""
    per_seed = {}
    for seed, folder in sorted(paths.seed_dirs(Path(benchmark_folder)).items()):
        files = SeedPaths(folder)
        per_seed[seed] = {**seed_cost(seed_attempts(folder, gpus_per_node, now)),
                          "done": files.mllog.exists(), "stopped": files.stopped.exists()}
    out = {**total(per_seed.values()), "seeds": {str(k): v for k, v in per_seed.items()}, "planned": plan}
    # The trial of the planner's candidates (mlrepro.kinds.plan_trial) ran for this benchmark: it counts.
    trials = {name: seed_cost(seed_attempts(folder, gpus_per_node, now))
              for name, folder in paths.trial_dirs(Path(benchmark_folder)).items()}
    if trials:
        out |= {**total([*per_seed.values(), *trials.values()]), "trials": trials}
    return out


def total(costs: Iterable[dict]) -> dict:
    """The sum of seed (or benchmark) costs."""
    costs = list(costs)
    energy = [c.get("energy_kwh") for c in costs if c["attempts"]]  # a seed not started has used nothing yet
    return {"gpu_hours": sum(c["gpu_hours"] for c in costs),
            "failed_gpu_hours": sum(c["failed_gpu_hours"] for c in costs),
            "attempts": sum(c["attempts"] for c in costs),
            "failed_attempts": sum(c["failed_attempts"] for c in costs),
            "energy_kwh": sum(energy) if energy and all(e is not None for e in energy) else None,
            "estimated": any(c.get("estimated") for c in costs)}


def saved_by_stopping(spent_per_finished_seed: Sequence[float], seeds_not_run: int) -> float | None:
    """What the seeds that were never run would have cost, at the mean cost of the seeds that ran."""
    if not spent_per_finished_seed:
        return None
    return statistics.fmean(spent_per_finished_seed) * seeds_not_run


def unit_of(attempts_by_seed) -> str:
    """The unit of recorded attempts (each says its system's device), GPU-hours when none says."""
    devices = {a.get("device") for attempts in attempts_by_seed for a in attempts if a.get("device")}
    return unit("cpu") if devices == {"cpu"} else unit("cuda")


def hours(value: float | None, unit_name: str = "GPU-hours") -> str:
    """A cost as the reports print it: three significant figures, small ones in GPU-seconds' place."""
    if value is None:
        return "-"
    return f"{value:.3g} {unit_name}"
