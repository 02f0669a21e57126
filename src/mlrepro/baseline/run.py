"""Run the baseline probe's configured sizes on this node and write baseline.json + the report; `mlrepro baseline`."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from mlrepro import config, paths
from mlrepro.baseline import probe, report
from mlrepro.preflight.run import load_settings
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger("mlrepro.baseline")

FORMULA = ("Megatron-LM num_floating_point_operations (commit d98e8a6): 72 B s L h^2 (1 + s/(12h) + V/(12 L h)); "
           "the baseline checklist's 16 B s L h^2 (1 + s/(6h)) undercounts 4.5x (mlrepro.baseline.flops)")


def baseline(system: str, settings: dict, out_dir: Path, megatron_rows: list[dict] = ()) -> dict:
    """Every configured probe run (an error is recorded in its row, the others still run), after the
    Megatron rows (workload (a), measured by mlrepro.baseline.megatron, or saying why not)."""
    import torch

    b = settings["baseline"]
    runs = list(megatron_rows)
    if not torch.cuda.is_available():
        doc = {"system": system, "runs": runs, "why": "not applicable: no CUDA GPU on this node", "flops_formula": FORMULA}
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        for spec in b["runs"]:
            t0 = time.monotonic()
            if t0 - start > b["budget_s"]:
                runs.append({**spec, "error": f"skipped: the baseline's budget of {b['budget_s']} s was spent"})
                continue
            try:
                row = probe.measure(spec["model"], spec["precision"], spec["mbs"], steps=b["steps"], warmup=b["warmup"],
                                    ga=spec["ga"], attention=spec["attention"], compile_mode=spec["compile_mode"],
                                    residual=spec["residual"], compile_scope=spec["compile_scope"])
            except Exception as exc:  # an OOM or a missing kernel costs that row, not the report
                log.exception("baseline run %s failed", spec)
                row = {**spec, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            row["wall_s"] = round(time.monotonic() - t0, 1)
            log.info("%s", json.dumps(row))
            runs.append(row)
            # Written after every run: a job killed at its time limit still leaves the rows it measured.
            atomic_write_json(out_dir / "baseline.json", {"system": system, "runs": runs, "flops_formula": FORMULA})
            probe.free(torch)
        doc = {"system": system, "runs": runs, "flops_formula": FORMULA}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "baseline.json", doc)
    report.write(doc, out_dir / "baseline_report.md", out_dir / "baseline_report.html", out_dir / "baseline.png")
    return doc


def add_arguments(parser) -> None:
    parser.add_argument("--system", default="local", help="names the results folder")
    parser.add_argument("--root", default=".", help="the repository (config/preflight.yaml)")
    parser.add_argument("--out", help="folder (default results/baseline/<system>)")
    parser.add_argument("--settings", help="settings file (default <root>/config/preflight.yaml)")


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path(args.root).resolve()
    try:
        settings = load_settings(root, Path(args.settings).resolve() if args.settings else None)
    except config.ConfigError as exc:
        print(f"error: {exc}")
        return 2
    out = Path(args.out) if args.out else paths.baseline_dir(root, args.system)
    doc = baseline(args.system, settings, out)
    print(f"written: {out / 'baseline.json'} ({len(doc['runs'])} runs)")
    # Megatron-LM needs its pinned source and the implementation's launch, which the workflow provides.
    print("the probe only; with Megatron-LM's rows (workload (a)) next to it: snakemake --profile local "
          f"{paths.baseline_json(root, args.system).relative_to(root)} --config system={args.system}")
    return 0
