"""The rules of workflow/rules/score.smk: each seed's run record, then the score, its verdict and report."""

from __future__ import annotations

import json
from pathlib import Path

from mlrepro import kinds, paths
from mlrepro.launch import chain, job
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_json


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, int(smk.wildcards.seed), Path(smk.input[0]),
                       Path(smk.output[0])), {}))
def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path) -> None:
    """run.json of the seed, scored by its kind with the plan it ran (plan.json)."""
    bench = settings.benchmark(benchmark)
    plan = job.read_plan(mllog_path.parent)
    run = kinds.of(bench).score_seed(settings, bench, seed, mllog_path, plan)
    if chained := chain.summary(mllog_path.parent):
        run["segments"] = chained  # a pretraining seed run as a chain of time-limited jobs
    atomic_write_json(out, run)


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
    from mlrepro.scoring import rules as scoring_rules
    from mlrepro.scoring import score as scoring

    runs = [json.loads(Path(p).read_text()) for p in run_files]
    result = scoring.score_runs(mllogs, scoring_rules.for_benchmark(settings.benchmark(benchmark)), runs=runs)
    atomic_write_json(out, result)
    verdict(settings, benchmark, out, reference_file, container_file, verdict_out, distribution)
    report(settings, benchmark, out, mllogs, report_html, plot_dir, verdict_out)


def report(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path, plot_dir: Path,
           verdict_file: Path | None = None) -> None:
    from mlrepro.scoring import report as reports
    from mlrepro.scoring import verdict as verdicts

    section = None
    if verdict_file is not None:
        svg = plot_dir / "distribution.svg"
        section = verdicts.render_section(json.loads(Path(verdict_file).read_text()),
                                          svg.read_text() if svg.is_file() else None)
    reports.write_report(json.loads(Path(score_file).read_text()), mllogs, out, plot_dir=plot_dir,
                         verdict_html=section, measures=settings.benchmark(benchmark).target.get("measures"))


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
    from mlrepro.util.fsutil import atomic_write_text

    pre = preflight_file(settings, benchmark)
    environment = {"container": json.loads(Path(container_file).read_text()),
                   "preflight": json.loads(pre.read_text()) if pre else None}
    result = verdicts.compare(json.loads(Path(score_file).read_text()), json.loads(Path(reference_file).read_text()),
                              benchmark=benchmark, system=dataclasses.asdict(settings.system), environment=environment)
    result["config"] = mlperf.config_in_use(settings.benchmark(benchmark), settings.system)
    atomic_write_json(out, result)
    atomic_write_text(plot, verdicts.distribution_plot(result))
