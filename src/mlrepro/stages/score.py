"""The rules of workflow/rules/score.smk: each seed's run record, then the score, its verdict and report."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from mlrepro import kinds, paths
from mlrepro.config import ConfigError
from mlrepro.kinds import mlperf
from mlrepro.launch import chain, finished, job
from mlrepro.plan import goodput as failure_model
from mlrepro.scoring import cost, cost_report, early_stop, goodput, tfevents
from mlrepro.scoring import rules as scoring_rules
from mlrepro.scoring import score as scoring
from mlrepro.scoring import verdict as verdicts
from mlrepro.scoring.records import RunRecord, ScoreRecord, VerdictRecord
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_text

log = logging.getLogger("mlrepro.stages")


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, int(smk.wildcards.seed), Path(smk.input[0]),
                       Path(smk.output[0])), {"tensorboard_dir": Path(smk.output.tensorboard)}))
def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path, *,
               tensorboard_dir: Path | None = None) -> None:
    """run.json of the seed, scored by its kind with the plan it ran (plan.json), and its scored curve as
    TensorBoard event files (results/tensorboard/<benchmark>/seed_<seed>/, mlrepro.scoring.tfevents)."""
    bench = settings.benchmark(benchmark)
    seed_dir = mllog_path.parent
    tensorboard_dir = tensorboard_dir or paths.scored_tensorboard_dir(settings.root, benchmark, seed)
    if early_stop.is_stopped(seed_dir):
        RunRecord.not_run(seed, "not run: the early stop settled the reproduction").write(out)
        tfevents.write_scalars(tensorboard_dir, {})  # no curve: an empty run, so the folder says the seed was scored
        return
    record = RunRecord.of(kinds.of(bench).score_seed(settings, bench, seed, mllog_path, job.read_plan(seed_dir)))
    record = record.with_segments(chain.summary(seed_dir))  # a pretraining seed run as a chain of time-limited jobs
    if why := finished.changed(seed_dir, mllog_path):
        # A seed whose log changed after it finished is not scored as the run it was: it says so, and how
        # to get that run back (issue 26: a truncated log was scored failed with no word why).
        rerun = finished.rerun_command(settings.system, benchmark, seed_dir)
        record = record.changed_after(why, rerun)
        log.warning("seed %s: %s; redo it with: %s", seed, why, rerun)
    record.write(out)
    tfevents.write_scalars(tensorboard_dir, tfevents.scored_series(
        record.to_json(), scoring_rules.for_benchmark(bench).target_metric))


def _score_arguments(smk, s):
    return ((s, smk.wildcards.benchmark, list(map(Path, smk.input.runs)), list(map(Path, smk.input.mllogs)),
             Path(smk.output[0])),
            {"reference_file": Path(smk.input.reference), "container_file": Path(smk.input.container),
             "verdict_out": Path(smk.output.verdict), "distribution": Path(smk.output.distribution),
             "report_html": Path(smk.output.html), "plot_dir": Path(smk.output.convergence).parent})


@rule(_score_arguments)
def score(settings, benchmark: str, run_files: list[Path], mllogs: list[Path], out: Path, *,
          reference_file: Path, container_file: Path, verdict_out: Path, distribution: Path,
          report_html: Path, plot_dir: Path) -> None:
    """score.json of the seeds' runs, its verdict against the reference (see mlrepro.scoring.verdict),
    with the runs' distributions plotted, and the report that shows both."""
    bench = settings.benchmark(benchmark)
    # Seeds the early stop did not run are no runs: the score says why instead.
    run_files, mllogs = early_stop.not_stopped(run_files), early_stop.not_stopped(mllogs)
    result = scoring.reproduction_score(run_files, scoring_rules.for_benchmark(bench),
                                        **reproduction_cost(settings, benchmark))
    for seed in result.changed_after_finish or []:
        log.warning("seed %s is not scored as the run it finished: %s; redo it with: %s",
                    seed["seed"], seed["reason"], seed["rerun"])
    judged = verdicts.reproduction_verdict(
        result, reference_file, container_file, preflight_file(settings, benchmark), benchmark=benchmark,
        system=dataclasses.asdict(settings.system),
        # kinds.mlperf's, whatever the kind: only an MLPerf implementation has a config_<SYS>.sh to name,
        # and for any other benchmark it finds none (None); the kinds' interface has no such question.
        config=mlperf.config_in_use(bench, settings.system))
    result.write(out)
    judged.write(verdict_out)
    report(settings, benchmark, result, judged, mllogs, report_html, plot_dir, distribution)


def _planned(settings, bench, plan: job.SeedPlan | None = None) -> tuple[dict, job.SeedPlan] | None:
    """What the benchmark's seeds cost at most (the wall-time) and as the reference ran: with the plan
    given (the DAG's), else a seed's that ran (plan.json), else the one its kind makes; None when no plan
    can be made yet."""
    plans = (job.read_plan(f) for f in paths.seed_dirs(paths.benchmark_dir(settings.root, bench.name)).values())
    plan = plan or next((p for p in plans if p is not None), None)
    if plan is None:
        try:
            plan = kinds.of(bench).plan_seed(settings, bench.name, bench.seeds[0])  # planned only: prepare would fetch
        except (ConfigError, OSError, ValueError):
            return None
    ref = early_stop.reference_runs(settings.root, bench, scoring_rules.for_benchmark(bench)) or []
    planned = cost.planned(len(bench.seeds), plan.nodes, plan.gpus_per_node, plan.walltime_minutes,
                           [r.minutes for r in ref if r.counted])
    return planned, plan


def planned_line(settings, benchmark: str, plan: job.SeedPlan | None = None) -> str:
    """The dry run's plan line: what the benchmark's seeds will cost at most, and as the reference ran."""
    found = _planned(settings, settings.benchmark(benchmark), plan)
    if found is None:
        return f"{benchmark}: cost planned once its seeds' shape is known"
    p, plan = found
    unit = cost.unit(settings.system.device)
    line = (f"{benchmark}: planned {p['seeds']} seeds x {plan.nodes} x {plan.gpus_per_node}: at most "
            f"{p['upper_bound_gpu_hours']:.3g} {unit} at the wall-time of {plan.walltime_minutes} min")
    if p["expected_gpu_hours"] is not None:
        line += (f", expected {p['expected_gpu_hours']:.3g} {unit} at the reference's mean run time "
                 f"({p['reference_mean_minutes']:.3g} min, start-up not included)")
    return line


def reproduction_cost(settings, benchmark: str) -> dict:
    """score.json's cost (planned and spent), running verdict, early stop (mlrepro.scoring.cost) and effective
    training time (mlrepro.scoring.goodput)."""
    bench = settings.benchmark(benchmark)
    found = _planned(settings, bench)
    gpus_per_node = found[1].gpus_per_node if found else settings.system.gpus_per_node
    spent = cost.benchmark_cost(paths.benchmark_dir(settings.root, benchmark), gpus_per_node,
                                found[0] if found else None)
    spent["unit"] = cost.unit(settings.system.device)
    measured = goodput.benchmark_goodput(paths.benchmark_dir(settings.root, benchmark), gpus_per_node)
    injected = bench.inject_failures or {}
    if measured and injected.get("mtbf_seconds"):
        # Failures at a known rate: the failure model's prediction beside what the seeds measured.
        lim = chain.limits(bench.segments, settings.system.max_job_minutes)
        span = lim.training_seconds if lim is not None else None
        measured["predicted"] = failure_model.measured_prediction(measured, injected["mtbf_seconds"], job_limit_s=span)
    out = {"cost": spent, "running_verdict": early_stop.running(settings.root, bench, scoring_rules.for_benchmark(bench)),
           "goodput": measured}
    decision = early_stop.read_decision(settings.root, benchmark)
    out["complete_mlperf_result"] = decision is None
    if decision is not None:
        out["early_stop"] = decision
    return out


def report(settings, benchmark: str, score: ScoreRecord, verdict: VerdictRecord, mllogs: list[Path], out: Path,
           plot_dir: Path, distribution: Path) -> None:
    """The benchmark's report.html: its score, and its verdict with the runs' distributions (plotted to
    `distribution`)."""
    # pyplot, loaded by the score rule only: Snakemake imports this module to plan (planned_line).
    from mlrepro.scoring import report as reports
    from mlrepro.scoring import verdict_report

    svg = verdict_report.distribution_plot(verdict.to_json())
    atomic_write_text(distribution, svg)
    shown = score.as_written()
    section = (verdict_report.render_section(verdict.as_written(), svg) + cost_report.section(shown)
               + goodput.section(shown))
    reports.write_report(shown, mllogs, out, plot_dir=plot_dir, verdict_html=section or None,
                         measures=settings.benchmark(benchmark).target.get("measures"))


def preflight_file(settings, benchmark: str) -> Path | None:
    """The system's preflight record, when one was made."""
    for path in paths.preflight_files(settings.root, settings.system.name, benchmark):
        if path.is_file():
            return path
    return None
