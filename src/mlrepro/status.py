"""`mlrepro status results/<benchmark>`: each seed's state, live from Slurm.

Reads the seed folders the launch stage writes (results/<benchmark>/seed_<N>/, mlrepro.paths.SeedPaths):

    plan.json     the seed's launch plan (mlrepro.launch.job.SeedPlan)    the seed started
    job.json      mlrepro.paths.JobRecord (job id, attempt, nodes, ...)   launched, here or in Slurm
    failure.json  {"reason", "state", "exit_code", "job_id", "nodes"}    the last attempt failed
    run.json      {"seed", "minutes", "status", "converged", ...}        the run finished
    mllog.txt                                                            its MLPerf log

and asks Slurm (sacct, then squeue) about seeds that have a job but no result yet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from mlrepro import config, paths
from mlrepro.launch import chain
from mlrepro.paths import AttemptPaths, SeedPaths
from mlrepro.plan import goodput as failure_model
from mlrepro.pretrain import progress
from mlrepro.pretrain.progress import format_elapsed
from mlrepro.scoring import cost, early_stop, goodput, live, running_verdict
from mlrepro.scoring import rules as scoring_rules
from mlrepro.slurm import client as slurm
from mlrepro.slurm import node_health
from mlrepro.util import progress as stage_progress_files


# What a seed is, in the user's words.
DONE = "done"
FAILED = "failed"
RUNNING = "running"
PENDING = "pending"
FINISHING = "finishing"  # the Slurm job completed; its results are not collected yet
SUBMITTED = "submitted"  # a job id is recorded but Slurm cannot say more
NOT_STARTED = "not started"
MISSING = "missing"
STOPPED = "stopped"  # the early stop did not run it, or cancelled it (mlrepro.scoring.early_stop)

_SUCCESS_STATUSES = {"success", "succeeded", "done", "ok", "completed", "complete"}


@dataclass
class SeedStatus:
    seed: int
    state: str
    job_id: str | None = None
    slurm_state: str | None = None
    elapsed_seconds: float | None = None
    nodes: list[str] | None = None
    reason: str | None = None
    attempt: int | None = None
    converged: bool | None = None
    progress: dict | None = None  # a running pretraining seed's step, tokens, loss, ETA (mlrepro.pretrain.progress)
    ranks: int | None = None  # the seed's plan (plan.json, written when it started): ranks and job time limit
    walltime_minutes: int | None = None


def parse_seeds(text: str) -> list[int]:
    """"1-10", "0,2,5", "1-3,7" -> sorted seed numbers."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"not a seed list: {text!r} (write e.g. 1-10 or 1,2,5)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"seed range {part!r} runs backwards")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def _read_json(path: Path) -> dict | None:
    try:
        return paths.read_record(path)
    except paths.RecordUnreadable as exc:
        return {"_unreadable": str(exc)}


def _nodes(value) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return slurm.expand_hostlist(value)
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return None  # a node count, not names


def seed_status(seed: int, folder: Path,
                job_info: Callable[[str], slurm.JobInfo] | None = None,
                evals: Callable[[Path], dict | None] | None = None) -> SeedStatus:
    """The state of one seed from its folder and, if it has a live job, from Slurm; a seed still
    at work shows its progress from its live log: a pretraining seed's step, tokens, loss and ETA,
    an MLPerf seed's samples against the reference's (`evals`, see mlperf_progress) and ETA."""
    status = _seed_status(seed, folder, job_info)
    if (plan := paths.read_plan(folder)) is not None:
        status.ranks, status.walltime_minutes = plan.get("ranks"), plan.get("walltime_minutes")
    trained = SeedPaths(folder).mllog.is_file()
    training = status.state not in (DONE, FAILED, MISSING) and not trained
    found, describe = None, None
    if training and (found := progress.live(folder)):
        describe = progress.describe
    elif training and evals is not None and (found := evals(folder)):
        describe = mlperf_describe
    if found:
        status.progress = found
        status.reason = describe(found)
        if status.state == NOT_STARTED and found["age_s"] < progress.STALE_S:  # a local seed (no Slurm job id) that is writing its log
            status.state = RUNNING
    if status.state == NOT_STARTED and trained:
        status.state, status.reason = FINISHING, "trained; its score is not written yet"
    return status


def mlperf_describe(p: dict) -> str:
    return live.describe(p)


def current_log(seed_dir: Path) -> Path | None:
    """The newest log of the seed's current attempt (job.json's logdir), or None."""
    job = paths.read_job(seed_dir)
    if job is None or job.logdir is None or not job.logdir.is_dir():
        return None
    return AttemptPaths(job.logdir).newest_log()


def mlperf_progress(benchmark_dir: Path) -> Callable[[Path], dict | None] | None:
    """How to read an MLPerf-style seed's progress from its eval events: the benchmark's metric and
    target from its config, the reference's samples to converge from reference.json (when written)."""
    root = paths.benchmark_root(benchmark_dir.resolve())
    try:
        bench = config.load_benchmark(root, benchmark_dir.name)
    except (config.ConfigError, OSError):
        return None
    if bench.is_pretrain:
        return None
    reference = live.reference_samples(_read_json(benchmark_dir / "reference.json"))

    def read(seed_dir: Path) -> dict | None:
        log = current_log(seed_dir)
        if log is None:
            return None
        found = live.parse(live.tail(log), bench.target["metric"], bench.target, reference)
        if found is not None:
            found["age_s"] = round(time.time() - log.stat().st_mtime, 1)
        return found

    return read


def stage_progress(benchmark_dir: Path) -> list[dict]:
    """The progress files of the benchmark's long stages (downloads), a corpus's tasks added up."""
    root = paths.benchmark_root(benchmark_dir.resolve())
    corpus = None
    try:
        corpus = config.load_benchmark(root, benchmark_dir.name).corpus
    except (config.ConfigError, OSError):
        pass
    groups: dict[str, list[dict]] = {}
    for path in paths.progress_files(root, benchmark_dir.name, corpus):
        record = stage_progress_files.read(path)
        if record is None:
            continue
        stage = path.name.removesuffix(".progress.json")
        what = (f"corpus {corpus} {stage.split('_task_')[0]}" if path.parent.name == corpus
                and path.parent.parent.name == "corpora" else f"{benchmark_dir.name} {stage}")
        groups.setdefault(what, []).append(record)
    return [{"stage": what, **stage_progress_files.combine(records, what)} for what, records in groups.items()]


def _seed_status(seed: int, folder: Path,
                 job_info: Callable[[str], slurm.JobInfo] | None = None) -> SeedStatus:
    if not folder.is_dir():
        return SeedStatus(seed=seed, state=MISSING)
    files = SeedPaths(folder)
    if (stopped := paths.read_json_if_exists(files.stopped)) is not None:
        return SeedStatus(seed=seed, state=STOPPED, reason=("cancelled" if stopped.get("cancelled") else "not run")
                          + " by the early stop")
    try:
        job, unreadable = paths.read_job(folder, strict=True), None
    except paths.RecordUnreadable as exc:
        job, unreadable = None, str(exc)
    failure = _read_json(files.failure)
    result = _read_json(files.run_json)
    job_id = job.job_id if job is not None and job.job_id not in (None, "") else None
    attempt = job.attempt if job is not None else None

    if result is not None and "_unreadable" not in result and files.mllog.is_file():
        status = str(result.get("status", "success")).lower()
        minutes = result.get("minutes")
        converged = result.get("converged")
        if isinstance(changed := result.get("changed_after_finish"), dict):
            return SeedStatus(seed=seed, state=FAILED, job_id=job_id, attempt=attempt,
                              reason=f"{changed.get('reason')}; redo it with: {changed.get('rerun')}")
        if status in _SUCCESS_STATUSES:
            said = [why for why in ("did not converge" if converged is False else None, _attempts_said(files)) if why]
            return SeedStatus(
                seed=seed, state=DONE, job_id=job_id,
                elapsed_seconds=float(minutes) * 60 if isinstance(minutes, (int, float)) else None,
                nodes=_nodes(job.nodes if job is not None else None), attempt=attempt,
                converged=converged if isinstance(converged, bool) else None,
                reason="; ".join(said) or None,
            )
        return SeedStatus(seed=seed, state=FAILED, job_id=job_id,
                          reason=f"run ended with status {status!r}", attempt=attempt)

    failure_is_current = failure is not None and (
        job_id is None or str(failure.get("job_id", "")) == job_id
        or files.failure.stat().st_mtime >= files.job.stat().st_mtime)

    if failure is not None and failure_is_current:
        reason = failure.get("_unreadable") or failure.get("reason") or failure.get("state") or "failed"
        exit_code = failure.get("exit_code")
        if exit_code not in (None, 0) and "exit" not in str(reason):
            reason = f"{reason} (exit code {exit_code})"
        if failure.get("error_lines"):  # the trainer's own last words (mlrepro.launch.attempt.error_lines)
            reason = f"{reason}; last error: {str(failure['error_lines'][-1]).strip()[:160]}"
        return SeedStatus(seed=seed, state=FAILED, job_id=str(failure.get("job_id") or job_id or "") or None,
                          slurm_state=failure.get("state"), nodes=_nodes(failure.get("nodes")),
                          reason=str(reason), attempt=attempt)

    if unreadable is not None:
        return SeedStatus(seed=seed, state=SUBMITTED, reason=unreadable)
    if job_id is None:
        return SeedStatus(seed=seed, state=NOT_STARTED)

    status = SeedStatus(seed=seed, state=SUBMITTED, job_id=job_id, attempt=attempt, nodes=_nodes(job.nodes))
    return _with_slurm_state(status, job_info)


def _with_slurm_state(status: SeedStatus, job_info: Callable[[str], slurm.JobInfo] | None) -> SeedStatus:
    """A submitted seed's status completed with what Slurm says of its job."""
    if job_info is None:
        status.reason = "not asked Slurm"
        return status
    try:
        info = job_info(status.job_id)
    except slurm.SlurmError as exc:
        status.reason = f"Slurm did not answer: {exc}"
        return status
    status.slurm_state = info.state
    status.elapsed_seconds = info.elapsed_seconds
    if info.nodes:
        status.nodes = info.nodes
    if info.state == slurm.PENDING:
        status.state, status.reason = PENDING, info.reason
    elif info.state == slurm.RUNNING:
        status.state = RUNNING
    elif info.state == slurm.COMPLETED:
        status.state, status.reason = FINISHING, "job completed; results not collected yet"
    elif info.terminal:
        status.state = FAILED
        detail = f" (exit code {info.exit_code})" if info.exit_code not in (None, 0) else ""
        status.reason = f"{info.state}{detail}"
    else:
        status.reason = "Slurm does not know this job (any more)"
    return status


def benchmark_status(benchmark_dir: Path, seeds: Iterable[int] | None = None,
                     job_info: Callable[[str], slurm.JobInfo] | None = None) -> list[SeedStatus]:
    """Every seed's status: the seed folders found plus any expected `seeds` without one."""
    found = paths.seed_dirs(benchmark_dir)
    wanted = sorted(set(found) | set(seeds or ()))
    evals = mlperf_progress(benchmark_dir)
    return [seed_status(s, found.get(s, SeedPaths.under(benchmark_dir, s).folder), job_info, evals) for s in wanted]


def configured_seeds(benchmark_dir: Path) -> list[int] | None:
    """The seeds that config/benchmarks/<name>.yaml configures, for a results/<name> folder of a checkout."""
    root = paths.benchmark_root(benchmark_dir.resolve())
    if not (root / "config" / "benchmarks" / f"{benchmark_dir.name}.yaml").is_file():
        return None
    try:
        return list(config.load_benchmark(root, benchmark_dir.name).seeds)
    except config.ConfigError:
        return None  # the workflow reports it; status still shows the folders


def _attempts_said(files: SeedPaths) -> str | None:
    """How a seed's attempts ended, by class (mlrepro.launch.attempt), when it took more than one."""
    classes = [str((paths.read_json_if_exists(a.record) or {}).get("class") or "?") for a in files.attempts()]
    if len(classes) < 2:
        return None
    return f"{len(classes)} attempts: " + ", ".join(c.replace("_", " ") for c in classes)


def format_table(rows: list[SeedStatus], seed_costs: dict | None = None) -> str:
    """One line per seed; SPENT is what its attempts cost (reproduction()'s cost["seeds"], by seed: GPU-
    or CPU-hours, and the energy where every attempt reported it)."""
    header = ("SEED", "STATE", "JOB", "ELAPSED", "NODES", "SPENT", "REASON")
    lines = [header]
    for r in rows:
        lines.append((str(r.seed), r.state, r.job_id or "-", format_elapsed(r.elapsed_seconds),
                      ",".join(r.nodes) if r.nodes else "-", _spent((seed_costs or {}).get(str(r.seed))),
                      r.reason or ""))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1]).rstrip()
                     for line in lines) + "\n"


def _spent(seed_cost: dict | None) -> str:
    if not seed_cost or not seed_cost.get("attempts"):
        return "-"
    kwh = seed_cost.get("energy_kwh")
    return f"{seed_cost['gpu_hours']:.3g}" + (f" ({kwh:.3g} kWh)" if kwh is not None else "")


def summary(rows: list[SeedStatus]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark_dir", type=Path, help="a results/<benchmark> folder")
    parser.add_argument("--seeds", help="seeds expected (e.g. 1-10; default: those config/benchmarks/<name>.yaml "
                                        "configures): those without a folder show as missing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-slurm", action="store_true", help="read only the seed folders; do not ask Slurm")
    parser.add_argument("--status-command", choices=("sacct", "squeue"), default="sacct",
                        help="how to ask Slurm about jobs (squeue where there is no accounting)")


def run(args: argparse.Namespace) -> int:
    folder: Path = args.benchmark_dir
    try:
        seeds = parse_seeds(args.seeds) if args.seeds else configured_seeds(folder)
    except ValueError as exc:
        print(f"mlrepro status: {exc}", file=sys.stderr)
        return 2
    if not folder.is_dir() and seeds is None:
        print(f"mlrepro status: {folder} is not a folder (expected results/<benchmark>)", file=sys.stderr)
        return 2
    job_info = None if args.no_slurm else (lambda job_id: slurm.job_info(job_id,
                                                                            status_command=args.status_command))
    rows = benchmark_status(folder, seeds, job_info)
    stages = stage_progress(folder)
    counts = summary(rows)
    extra = reproduction(folder)
    if args.json:
        print(json.dumps({"benchmark": folder.name, "folder": str(folder), "counts": counts, "stages": stages,
                          "seeds": [asdict(r) for r in rows], **extra}, indent=2))
        return 0
    for stage in stages:
        if stage["live"]:
            print(stage_progress_files.describe(stage))
    if not rows:
        print(f"{folder}: no seed folders (seed_<N>) yet")
        return 0
    print(format_table(rows, extra["cost"]["seeds"]), end="")
    print(f"{len(rows)} seeds: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    for line in reproduction_lines(extra):
        print(line)
    return 0


def reproduction(folder: Path) -> dict:
    """What the seeds cost so far, their effective training time, the running verdict, the early stop and
    the system's excluded nodes."""
    root = paths.benchmark_root(folder.resolve())
    spent = cost.benchmark_cost(folder, gpus_per_node=1)
    spent["unit"] = cost.unit_of(cost.seed_attempts(f, 1) for f in paths.seed_dirs(folder).values())
    out: dict = {"cost": spent, "early_stop": early_stop.read_decision(root, folder.name), "running_verdict": None,
                 "excluded_nodes": {}, "goodput": goodput.benchmark_goodput(folder)}
    for record in sorted((root / "results" / "nodes").glob(f"*/{node_health.FILE_NAME}")):
        with contextlib.suppress(ValueError):
            if nodes := node_health.read(record):
                out["excluded_nodes"][record.parent.name] = nodes
    bench = _benchmark(root, folder.name)
    if bench is not None and out["goodput"] and (bench.inject_failures or {}).get("mtbf_seconds"):
        # Failures injected at a known rate: the failure model's prediction, as the score stage makes it (the
        # benchmark's own job limit: status does not know the system's max_job_minutes).
        lim = chain.limits(bench.segments, None)
        span = lim.training_seconds if lim is not None else None
        out["goodput"]["predicted"] = failure_model.measured_prediction(
            out["goodput"], bench.inject_failures["mtbf_seconds"], job_limit_s=span)
    if bench is not None and any(SeedPaths(f).mllog.is_file() for f in paths.seed_dirs(folder).values()):
        out["running_verdict"] = early_stop.running(root, bench, scoring_rules.for_benchmark(bench))
    out["outside_band"] = _outside_band(root, folder, bench)
    return out


def _outside_band(root: Path, folder: Path, bench) -> dict[str, str]:
    """Running seeds whose evaluations left the reference runs' band: they have already lost."""
    running = {s: f for s, f in paths.seed_dirs(folder).items() if not SeedPaths(f).mllog.is_file()}
    if bench is None or bench.is_pretrain or not running:
        return {}
    rules = scoring_rules.for_benchmark(bench)
    curves = early_stop.reference_curves(root, bench, rules)
    found = {}
    for seed, f in running.items():
        result = early_stop.live_band(f, curves, rules)
        if result is not None and result.lost:
            found[str(seed)] = result.message()
    return found


def _benchmark(root: Path, name: str):
    if not (root / "config" / "benchmarks" / f"{name}.yaml").is_file():
        return None
    try:
        return config.load_benchmark(root, name)
    except config.ConfigError:
        return None


def reproduction_lines(extra: dict) -> list[str]:
    c = extra["cost"]
    lines = [f"spent: {c['gpu_hours']:.3g} {c['unit']}" + (f", {c['energy_kwh']:.3g} kWh" if c.get("energy_kwh") is not None else "")
             + f" over {c['attempts']} attempts"
             + (f" ({c['failed_attempts']} failed: {c['failed_gpu_hours']:.3g} {c['unit']})" if c["failed_attempts"] else "")
             + (" (partly estimated from file times)" if c.get("estimated") else "")]
    g = extra.get("goodput")
    if g:
        for seed, of_seed in sorted((g.get("seeds") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(goodput.status_line(f"seed {seed}", of_seed))
        if len(g.get("seeds") or {}) > 1:
            lines.append(goodput.status_line("all seeds", g))
        if g.get("planned_interval") or g.get("checkpoint_interval_steps") is not None:
            lines.append(goodput.interval_words(g))
        if g.get("predicted"):
            lines.append(f"predicted effective training time {goodput.percent(g['predicted']['effective'])} "
                         f"(the failure model at the measured costs and the injected failure rate)")
    rv = extra.get("running_verdict")
    if rv:
        lines.append(f"running verdict: after {rv['seeds_finished']} of {rv['seeds_required']} seeds, "
                     + running_verdict.outlook_text(rv))
    if extra.get("early_stop"):
        lines.append(f"early stop: {extra['early_stop']['message']}")
    for seed, why in sorted(extra.get("outside_band", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"seed {seed} has already lost: evaluations {why}")
    for system, nodes in extra.get("excluded_nodes", {}).items():
        lines.append(f"excluded nodes ({system}): {', '.join(sorted(nodes))}")
        for name, rec in sorted(nodes.items()):
            lines.append(f"  {name}: since {rec.get('since')}, {rec.get('benchmark')} seed {rec.get('seed')} attempt "
                         f"{rec.get('attempt')}: {rec.get('why')}; after repair: mlrepro nodes clear {name} "
                         f"--system {system}")
    return lines
