"""The rules of workflow/rules/score.smk: each seed's run record, then the score, its verdict and report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mlrepro import kinds, paths
from mlrepro.launch import chain, finished, job
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_json


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, int(smk.wildcards.seed), Path(smk.input[0]),
                       Path(smk.output[0])), {}))
def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path) -> None:
    """run.json of the seed, scored by its kind with the plan it ran (plan.json)."""
    from mlrepro.scoring import early_stop

    bench = settings.benchmark(benchmark)
    if early_stop.is_stopped(mllog_path.parent):
        atomic_write_json(out, {"seed": seed, "stopped": True, "counted": False, "minutes": None,
                                "reasons": ["not run: the early stop settled the reproduction"]})
        return
    plan = job.read_plan(mllog_path.parent)
    run = kinds.of(bench).score_seed(settings, bench, seed, mllog_path, plan)
    if chained := chain.summary(mllog_path.parent):
        run["segments"] = chained  # a pretraining seed run as a chain of time-limited jobs
    if why := finished.changed(mllog_path.parent, mllog_path):
        changed_after_finish(run, why, finished.rerun_command(settings.system, benchmark, mllog_path.parent))
    atomic_write_json(out, run)


def changed_after_finish(run: dict, why: str, rerun: str) -> None:
    """A seed whose log changed after it finished is not scored as the run it was: it says so, and how
    to get that run back (issue 26: a truncated log was scored failed with no word why)."""
    run["changed_after_finish"] = {"reason": why, "rerun": rerun}
    run["counted"] = False
    run["reasons"] = [*run.get("reasons", []), f"{why}; redo the seed: {rerun}"]
    logging.getLogger("mlrepro.stages").warning("seed %s: %s; redo it with: %s", run.get("seed"), why, rerun)


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
    """score.json of the seeds' runs, its verdict against the reference, and the report that shows both."""
    from mlrepro.scoring import early_stop
    from mlrepro.scoring import rules as scoring_rules
    from mlrepro.scoring import score as scoring

    # Seeds the early stop did not run are no runs: the score says why instead.
    runs = [json.loads(Path(p).read_text()) for p in run_files if not early_stop.is_stopped(Path(p).parent)]
    mllogs = [m for m in mllogs if not early_stop.is_stopped(Path(m).parent)]
    result = scoring.score_runs(mllogs, scoring_rules.for_benchmark(settings.benchmark(benchmark)), runs=runs)
    result.update(reproduction_cost(settings, benchmark))
    if "early_stop" in result:
        result["valid"] = False
        result["reasons"].insert(0, result["early_stop"]["message"])
    if changed := [{"seed": r.get("seed"), **r["changed_after_finish"]} for r in runs if r.get("changed_after_finish")]:
        result["changed_after_finish"] = changed
        for seed in changed:
            logging.getLogger("mlrepro.stages").warning("seed %s is not scored as the run it finished: %s; redo it "
                                                        "with: %s", seed["seed"], seed["reason"], seed["rerun"])
    atomic_write_json(out, result)
    verdict(settings, benchmark, out, reference_file, container_file, verdict_out, distribution)
    report(settings, benchmark, out, mllogs, report_html, plot_dir, verdict_out)


def _planned(settings, bench, plan: job.SeedPlan | None = None) -> tuple[dict, job.SeedPlan] | None:
    """What the benchmark's seeds cost at most (the wall-time) and as the reference ran: with the plan
    given (the DAG's), else a seed's that ran (plan.json), else the one its kind makes; None when no plan
    can be made yet."""
    from mlrepro.config import ConfigError
    from mlrepro.scoring import cost, early_stop
    from mlrepro.scoring import rules as scoring_rules

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
    from mlrepro.scoring import cost

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
    """score.json's cost (planned and spent), running verdict and early stop (mlrepro.scoring.cost)."""
    from mlrepro.scoring import cost, early_stop
    from mlrepro.scoring import rules as scoring_rules

    bench = settings.benchmark(benchmark)
    found = _planned(settings, bench)
    gpus_per_node = found[1].gpus_per_node if found else settings.system.gpus_per_node
    spent = cost.benchmark_cost(paths.benchmark_dir(settings.root, benchmark), gpus_per_node,
                                found[0] if found else None)
    spent["unit"] = cost.unit(settings.system.device)
    out = {"cost": spent, "running_verdict": early_stop.running(settings.root, bench, scoring_rules.for_benchmark(bench))}
    decision = early_stop.read_decision(settings.root, benchmark)
    out["complete_mlperf_result"] = decision is None
    if decision is not None:
        out["early_stop"] = decision
    return out


def report(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path, plot_dir: Path,
           verdict_file: Path | None = None) -> None:
    from mlrepro.scoring import cost_report
    from mlrepro.scoring import report as reports
    from mlrepro.scoring import verdict_report

    score = json.loads(Path(score_file).read_text())
    section = cost_report.section(score)
    if verdict_file is not None:
        svg = plot_dir / "distribution.svg"
        section = verdict_report.render_section(json.loads(Path(verdict_file).read_text()),
                                          svg.read_text() if svg.is_file() else None) + section
    reports.write_report(score, mllogs, out, plot_dir=plot_dir, verdict_html=section or None,
                         measures=settings.benchmark(benchmark).target.get("measures"))


def preflight_file(settings, benchmark: str) -> Path | None:
    """The system's preflight record, when one was made."""
    for path in paths.preflight_files(settings.root, settings.system.name, benchmark):
        if path.is_file():
            return path
    return None


def verdict(settings, benchmark: str, score_file: Path, reference_file: Path, container_file: Path,
            out: Path, plot: Path) -> None:
    """Your score against the reference's (see mlrepro.scoring.verdict), with the runs' distributions plotted."""
    import dataclasses

    from mlrepro.kinds import mlperf
    from mlrepro.scoring import verdict as verdicts
    from mlrepro.scoring import verdict_report
    from mlrepro.util.fsutil import atomic_write_text

    pre = preflight_file(settings, benchmark)
    environment = {"container": json.loads(Path(container_file).read_text()),
                   "preflight": json.loads(pre.read_text()) if pre else None}
    result = verdicts.compare(json.loads(Path(score_file).read_text()), json.loads(Path(reference_file).read_text()),
                              benchmark=benchmark, system=dataclasses.asdict(settings.system), environment=environment)
    result["config"] = mlperf.config_in_use(settings.benchmark(benchmark), settings.system)
    yours = json.loads(Path(score_file).read_text())
    for key in ("cost", "early_stop", "running_verdict", "complete_mlperf_result"):
        if key in yours:
            result[key] = yours[key]
    if "early_stop" in yours:
        # Settled before all its seeds ran: the early stop's own verdict, not the score's "not valid".
        result["verdict"] = verdicts.NOT_REPRODUCED
        result["why"] = [yours["early_stop"]["message"]] + [w for w in result["why"]
                                                            if w != yours["early_stop"]["message"]]
    atomic_write_json(out, result)
    atomic_write_text(plot, verdict_report.distribution_plot(result))
