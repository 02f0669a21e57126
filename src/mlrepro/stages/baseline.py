"""The rules of workflow/rules/baseline.smk: what the node reaches (mlrepro.baseline): the portable
probe, and Megatron-LM runs of the pretraining family's GPT (workload (a)), one per precision."""

from __future__ import annotations

import json
from pathlib import Path

from mlrepro.baseline import megatron
from mlrepro.baseline.run import baseline as write_baseline
from mlrepro.preflight.run import healthy_record
from mlrepro.stages.process import rule


@rule(lambda smk, s: ((s, smk.params.settings["baseline"], smk.wildcards.precision, Path(smk.input.preflight),
                       Path(smk.output.json), Path(smk.log.megatron)), {}), log="stage")
def baseline_megatron(settings, baseline_settings: dict, precision: str, preflight_json: Path, out_json: Path,
                      megatron_log: Path) -> None:
    megatron.run(settings, baseline_settings, precision, preflight_json, out_json, megatron_log)


@rule(lambda smk, s: ((s, smk.params.settings, Path(smk.input.preflight), list(map(Path, smk.input.megatron)),
                       Path(smk.output.json).parent), {}))
def baseline(settings, preflight_settings: dict, preflight_json: Path, megatron_rows: list[Path], out_dir: Path) -> None:
    """The probe's rows and, on a CUDA system, the baseline_megatron jobs' rows (elsewhere rows saying why not)."""
    system = settings.system
    healthy_record(preflight_json)
    if system.device == "cuda":
        rows = []
        for p in megatron_rows:  # a row, or one per layout (baseline: megatron: layouts)
            record = json.loads(Path(p).read_text())
            rows += record if isinstance(record, list) else [record]
    else:
        rows = megatron.not_applicable_rows(settings.root, system, preflight_settings["baseline"])
    write_baseline(system.name, preflight_settings, out_dir, rows)


def user_errors() -> tuple[type[Exception], ...]:
    return ()  # a failed measurement is the stage's traceback
