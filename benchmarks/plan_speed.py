"""How long `mlrepro plan` takes to price every layout and solve, from 8 to 1,024 GPUs.

    PYTHONPATH=src python benchmarks/plan_speed.py [--gpus 8 64 512 1024]

Prints one row per (workload, GPU count): layouts priced, candidates the pulp program selects
among, and wall seconds of one plan (after one warm-up plan, so that importing pulp and reading
the RCP files is not counted; the cold first plan is shown separately). Goal: < 1 s at 1,024.

Recorded (2026-11-23, this 2-core machine shared with five other engineers' tests, load average
~4; docs/measurements/planner/plan_speed.txt): at 1,024 GPUs gpt-175b 0.183 s, gpt-13b 0.061 s,
llama31_405b 0.305 s (41,192 layouts priced), llama2_70b_lora 0.216 s; the slowest of all rows
0.305 s; a fresh process's first two plans 0.63 s. On a quieter machine earlier the same day the
slowest 1,024-GPU row was 0.168 s.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from mlrepro.plan import hardware, search, workloads

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 64, 128, 256, 512, 1024])
    args = parser.parse_args()
    h100 = hardware.load(ROOT, "dgxh100-64x8", measured=False)
    cases = [("gpt-175b", lambda: workloads.gpt("175b")), ("gpt-13b", lambda: workloads.gpt("13b")),
             ("llama31_405b", lambda: workloads.LLAMA31_405B), ("llama2_70b_lora", lambda: workloads.LLAMA2_70B_LORA)]
    started = time.perf_counter()
    search.plan(workloads.LLAMA2_70B_LORA, h100.with_gpus(8))
    search.plan(workloads.LLAMA31_405B, h100.with_gpus(512))
    cold = time.perf_counter() - started
    rows = []
    for name, make in cases:
        for gpus in args.gpus:
            w = make()
            t0 = time.perf_counter()
            try:
                plan = search.plan(w, h100.with_gpus(gpus))
                best, evaluated = plan.layout.short(), plan.evaluated
            except search.PlanError:
                best, evaluated = "(does not fit)", None
            rows.append({"workload": name, "gpus": gpus, "layouts": evaluated,
                         "seconds": round(time.perf_counter() - t0, 3), "best": best})
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(pd.DataFrame(rows).to_string(index=False))
    print(f"\nfirst two plans in a fresh process (imports, RCP files): {cold:.2f} s")


if __name__ == "__main__":
    main()
