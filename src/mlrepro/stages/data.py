"""The rule of workflow/rules/data.smk: the benchmark's dataset downloaded, verified, its manifest written."""

from __future__ import annotations

from pathlib import Path

from mlrepro import kinds
from mlrepro.data import pipeline
from mlrepro.stages.process import OWN, rule


def fill(settings, benchmark: str, stage: str, out: Path, log_path: Path) -> None:
    """A data stage (dataset, checkpoint) of the benchmark, with the scripts of its implementation."""
    bench = settings.benchmark(benchmark)
    pipeline.fill_stage(settings, benchmark, stage, out, log_path,
                        lambda: kinds.of(bench).implementation_folder(bench, settings.system))


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0]), Path(smk.log[0])), {}), log=OWN)
def dataset(settings, benchmark: str, out: Path, log_path: Path) -> None:
    fill(settings, benchmark, "dataset", out, log_path)
