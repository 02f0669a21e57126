"""The rule of workflow/rules/preflight.smk: is this system's node healthy (mlrepro.preflight)?"""

from __future__ import annotations

from pathlib import Path

from mlrepro.preflight import run
from mlrepro.stages.process import rule


@rule(lambda smk, s: ((s, smk.params.settings, Path(smk.output.json).parent), {}))
def preflight(settings, preflight_settings: dict, out_dir: Path) -> None:
    system = settings.system
    run.preflight(system.name, preflight_settings, system.gpus_per_node if system.device == "cuda" else None, out_dir)


def user_errors() -> tuple[type[Exception], ...]:
    return ()  # a failed check is the stage's traceback
