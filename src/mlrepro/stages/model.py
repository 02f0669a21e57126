"""The rule of workflow/rules/model.smk: the base checkpoint a benchmark fine-tunes, downloaded and verified."""

from __future__ import annotations

from pathlib import Path

from mlrepro.stages.data import fill
from mlrepro.stages.process import OWN, rule


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0]), Path(smk.log[0])), {}), log=OWN)
def base_checkpoint(settings, benchmark: str, out: Path, log_path: Path) -> None:
    fill(settings, benchmark, "checkpoint", out, log_path)
