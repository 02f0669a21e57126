"""The planner's step time against measured steps of one system, before and after calibration.

    PYTHONPATH=src python benchmarks/planner_calibration.py                       # the recorded 2x H200 rows
    PYTHONPATH=src python benchmarks/planner_calibration.py --baseline B.json [--baseline ...] \
        --preflight preflight.json [--gemm gemm_sweep.json] --system device-h200x2

Reads recorded files only (no GPU): the baseline stage's Megatron-LM rows (baseline.json, workload
"megatron"), preflight.json (all_reduce by size, copy rate) and a GEMM sweep (preflight.json's "gemm" or
a gemm_sweep.json of the same format). Prints, for every row, the prediction before calibration
(measured figures, default constants), after it (constants fitted on all rows) and left out (fitted on
the other rows), then, per model and global batch, the planner's first choice after calibration
against the fastest layout measured. Outputs are kept in docs/measurements/planner/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlrepro.plan import calibration, hardware, search, workloads

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "fixtures" / "planner" / "h200x2"


def facts_of(system: str, preflight: dict | None, baselines: list[dict], gemm: dict | None) -> hardware.SystemFacts:
    if gemm is not None and preflight is not None:
        preflight = {**preflight, "gemm": gemm}
    merged = {"runs": [r for b in baselines for r in b.get("runs") or []]}
    return hardware.with_measured(hardware.load(ROOT, system, measured=False), preflight, merged)


def first_choices(rows: list[calibration.Observation], facts: hardware.SystemFacts) -> list[str]:
    """Per (model, GBS): the planner's first choice on the calibrated facts and the fastest measured."""
    out = ["| model | GBS | planner's first choice | its measured s | fastest measured | s | first within 5%? |",
           "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list] = {}
    for o in rows:
        groups.setdefault((o.model, o.layout.gbs), []).append(o)
    for (model, gbs), group in sorted(groups.items()):
        gpus = max(o.layout.gpus for o in group)
        best = search.plan(workloads.gpt(model, gbs), facts.with_gpus(gpus), top=1).layout
        fastest = min(group, key=lambda o: o.measured_s)
        same = [o for o in group if (o.layout.tp, o.layout.pp, o.layout.dp, o.layout.vpp, o.layout.mbs)
                == (best.tp, best.pp, best.dp, best.vpp, best.mbs)]
        measured = same[0].measured_s if same else None
        verdict = "not measured" if measured is None else ("yes" if measured <= fastest.measured_s * 1.05 else "NO")
        out.append(f"| {model} | {gbs} | {best.short()} | {'-' if measured is None else f'{measured:.3f}'} | "
                   f"{fastest.label()} | {fastest.measured_s:.3f} | {verdict} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", type=Path, help="baseline.json (repeatable)")
    parser.add_argument("--preflight", type=Path, default=RECORDED / "preflight.json")
    parser.add_argument("--gemm", type=Path, help="gemm_sweep.json (default: preflight.json's gemm, if any)")
    parser.add_argument("--system", default="device-h200x2")
    args = parser.parse_args(argv)
    baselines = [json.loads(p.read_text()) for p in (args.baseline or [RECORDED / "baseline.json"])]
    preflight = json.loads(args.preflight.read_text()) if args.preflight else None
    gemm = json.loads(args.gemm.read_text()) if args.gemm else None
    facts = facts_of(args.system, preflight, baselines, gemm).with_tuning(None)
    rows = [o for i, b in enumerate(baselines) for o in calibration.baseline_observations(b, f"baseline{i}")]
    record = calibration.calibrate(rows, facts, source="recorded baseline rows")
    print(f"{args.system}: {len(rows)} measured steps; rates: {hardware.basis(facts)} basis "
          f"({'GEMM sweep' if facts.curves and facts.curves.gemm else 'no GEMM sweep: default curve'})\n")
    print(calibration.table_markdown(record))
    print("\nmax |error|: " + ", ".join(f"{k.removesuffix('_error_pct')} {v:.1f}%"
                                          for k, v in record["max_abs_error_pct"].items() if v is not None))
    tuned = facts.with_tuning(hardware.Tuning.from_json(record["tuning"]))
    print()
    print("\n".join(first_choices(rows, tuned)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
