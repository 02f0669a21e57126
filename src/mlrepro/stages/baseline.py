"""The rules of workflow/rules/baseline.smk: what the node reaches (mlrepro.baseline): the portable
probe, and Megatron-LM runs of the pretraining family's GPT (workload (a)), one per precision."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mlrepro.baseline import megatron
from mlrepro.plan import calibration
from mlrepro.baseline.run import baseline as write_baseline
from mlrepro.preflight.run import healthy_record
from mlrepro.stages.process import rule

log = logging.getLogger("mlrepro.stages")


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
    # The planner's constants fitted on these rows (results/plan/<system>/calibration.json): the next plan
    # and every seed's layout start from them. A fit that fails leaves the baseline standing.
    try:
        record = calibration.calibrate_system(settings.root, system.name)
    except (ValueError, ArithmeticError) as exc:
        log.warning("baseline: the planner was not calibrated on %s: %s", system.name, exc)
        return
    if record:
        log.info("baseline: planner calibrated on %d measured steps; max |error| before %s%%, after %s%%, "
                 "left out %s%%", len(record["rows"]), *record["max_abs_error_pct"].values())


def user_errors() -> tuple[type[Exception], ...]:
    return ()  # a failed measurement is the stage's traceback
