"""The early stop of a reproduction, read from and written to its folders (issue 24).

After each finished seed the train stage asks `evaluate`: with the benchmark's (or else the
system's) `early_stop:` policy on, the finished seeds and the reference runs go through
mlrepro.scoring.running_verdict.should_stop. A settled "not reproduced" is written once to
results/<benchmark>/early_stop.json:

    {"stopped_after": k, "required": N, "p_not_reproduced": 0.9995, "threshold": 0.99857,
     "confidence": 0.99, "min_seeds": 3, "time": iso, "spent_gpu_hours": ..., "saved_gpu_hours": ...,
     "unit": "CPU-hours", "message": "stopped after k of N seeds: ..."}

From then on a seed that has not started is not submitted (its folder gets stopped.json and an
empty mllog.txt, so the workflow completes and the score says why), and a running seed's backend,
which looks for the file while it waits, cancels its job (its GPU-hours counted). To run the
remaining seeds anyway: delete early_stop.json and the seeds' folders that hold stopped.json.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from mlrepro import paths
from mlrepro.scoring import cost, eval_band, mllog, score
from mlrepro.scoring import running_verdict as rv
from mlrepro.scoring.records import RunRecord
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text


def decision_file(root: Path, benchmark: str) -> Path:
    return paths.early_stop_file(root, benchmark)


def read_decision(root: Path, benchmark: str) -> dict | None:
    return paths.read_json_if_exists(decision_file(root, benchmark))


def policy_of(bench: Any, system: Any) -> rv.EarlyStop | None:
    """The benchmark's early_stop block, else the system's (both opt-in; null or absent is off)."""
    raw_bench = getattr(bench, "early_stop", None)
    if raw_bench is not None:
        return rv.early_stop_policy(raw_bench, str(getattr(bench, "source", "benchmark file")))
    return rv.early_stop_policy(getattr(system, "early_stop", None), f"config/systems/{system.name}.yaml")


def is_stopped(seed_folder: Path) -> bool:
    return paths.stopped_file(Path(seed_folder)).is_file()


def not_stopped(seed_files: list[Path]) -> list[Path]:
    """The files (run.json, mllog.txt) of the seeds the early stop did not stop."""
    return [f for f in seed_files if not is_stopped(Path(f).parent)]


def finished_runs(root: Path, benchmark: str, rules) -> dict[int, dict]:
    """The run records (as JSON) of the seeds with a result (mllog.txt, not a stopped seed's): run.json,
    else the log scored without the compliance checker."""
    out = {}
    for seed, folder in sorted(paths.seed_dirs(paths.benchmark_dir(root, benchmark)).items()):
        files = paths.SeedPaths(folder)
        run_json = paths.read_json_if_exists(files.run_json)
        if is_stopped(folder) or not files.mllog.is_file():
            continue
        record = RunRecord.from_json(run_json) if run_json else \
            score.run_record(files.mllog, rules, run_compliance=False, seed=seed)
        out[seed] = record.to_json()
    return out


def reference_scores(root: Path, bench: Any, rules) -> list[dict]:
    """The reference's scored runs: the shipped runs the benchmark names (read as they are now: a
    reference.json made before they changed would be stale), else reference.json once its rule ran
    (a published reference)."""
    if getattr(bench, "reference", None) and bench.reference.get("runs"):
        logs = sorted(Path(bench.reference["runs"]).glob("result_*.txt"))
        return [score.score_run(p, rules, run_compliance=False) for p in logs]
    ref = paths.read_json_if_exists(paths.benchmark_dir(root, bench.name) / "reference.json")
    return ((ref or {}).get("score") or {}).get("runs") or []


def reference_runs(root: Path, bench: Any, rules) -> list[rv.Run] | None:
    """The reference's runs as the running verdict reads them."""
    return rv.runs_of(reference_scores(root, bench, rules)) or None


def running(root: Path, bench: Any, rules, simulations: int = rv.SIMULATIONS) -> dict:
    """The running verdict (status, score.json, the report)."""
    seen = rv.runs_of(list(finished_runs(root, bench.name, rules).values()))
    return rv.outlook(seen, reference_runs(root, bench, rules), bench.required_runs, rules.max_failed_runs,
                      simulations)


def evaluate(root: Path, bench: Any, system: Any, rules, gpus_per_node: int, device: str | None) -> dict | None:
    """Stop now? Writes and returns the decision once settled; None while the reproduction goes on."""
    existing = read_decision(root, bench.name)
    if existing is not None:
        return existing
    policy = policy_of(bench, system)
    if policy is None:
        return None
    finished = finished_runs(root, bench.name, rules)
    seen = rv.runs_of(list(finished.values()))
    decision = rv.should_stop(seen, reference_runs(root, bench, rules), bench.required_runs,
                              rules.max_failed_runs, policy)
    if not decision["stop"]:
        return None
    bench_dir = paths.benchmark_dir(root, bench.name)
    spent = [cost.seed_cost(cost.seed_attempts(paths.SeedPaths.under(bench_dir, s).folder, gpus_per_node))["gpu_hours"]
             for s in finished]
    saved = cost.saved_by_stopping(spent, bench.required_runs - len(seen))
    unit = cost.unit(device)
    record = {"stopped_after": len(seen), "required": bench.required_runs,
              "p_not_reproduced": decision["p_not_reproduced"], "threshold": decision["threshold"],
              "confidence": policy.confidence, "min_seeds": policy.min_seeds,
              "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "spent_gpu_hours": sum(spent), "saved_gpu_hours": saved, "unit": unit,
              "why": decision["why"],
              "message": rv.stop_message(len(seen), bench.required_runs, decision["p_not_reproduced"], saved, unit)}
    atomic_write_json(decision_file(root, bench.name), record)
    return record


def mark_stopped(seed_folder: Path, mllog_out: Path, decision: dict, *, cancelled: bool) -> None:
    """A seed the early stop did not run (or cancelled): stopped.json says so, an empty mllog.txt completes it."""
    Path(seed_folder).mkdir(parents=True, exist_ok=True)
    atomic_write_json(paths.stopped_file(Path(seed_folder)), {"cancelled": cancelled, "decision": decision.get("message"),
                                                    "time": dt.datetime.now(dt.timezone.utc).isoformat(
                                                        timespec="seconds")})
    atomic_write_text(mllog_out, "")


def reference_curves(root: Path, bench: Any, rules) -> list:
    """The reference runs' evaluation curves ([[samples, value], ...] each), the band's input."""
    return eval_band.reference_curves(reference_scores(root, bench, rules))


def live_log(seed_folder: Path) -> Path | None:
    """The log the seed's newest attempt is writing: run.log locally, run.sub's <stamp>_1.log on Slurm."""
    attempts = paths.SeedPaths(seed_folder).attempts()
    if not attempts:
        return None
    logs = attempts[-1].run_sub_logs() or [attempts[-1].run_log]
    return logs[-1] if logs[-1].is_file() else None


def live_band(seed_folder: Path, curves: list, rules):
    """A running seed against the reference band (mlrepro.scoring.eval_band.BandCheck), or None without one."""
    log = live_log(seed_folder)
    if log is None or not curves:
        return None
    parsed = mllog.parse_text(log.read_text(errors="replace"), source=str(log))
    points = [[(r.metadata or {}).get("samples_count"), r.value] for r in parsed.records
              if r.key == rules.target_metric and isinstance(r.value, (int, float))]
    points = [p for p in points if isinstance(p[0], (int, float))]
    return eval_band.check(points, curves, lower_is_better=rules.target_direction == "<=")


def watch_band(seed_folder: Path, curves: list, rules, out: Path, stop, every_s: float = 10.0) -> None:
    """Until `stop` (a threading.Event) is set: write `out` (diverged.json) once the running seed has lost."""
    while not stop.wait(every_s):
        try:
            result = live_band(seed_folder, curves, rules)
        except (OSError, ValueError):
            continue
        if result is not None and result.lost:
            atomic_write_json(out, {"reason": "diverged: " + result.message(), **result.to_dict(),
                                    "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
            return
