"""The Megatron-DeepSpeed guide's hand-made GPT-3 layouts, checked by the planner.

For each row of the guide's table: does the layout fit the GPUs it names (with the best
micro-batch and recompute for it), and what would the planner choose on the same GPUs instead.
GPUs are A100 SXM (40 GB for 125M and 1.3B, 80 GB for 13B, as the table says); global batches
are the GPT-3 paper's; attention is materialised and dropout on, as in Megatron-DeepSpeed's
GPT-3 examples of that time; ZeRO-1 is the distributed optimizer.

    PYTHONPATH=src python benchmarks/plan_megatron_deepspeed_guide.py

Recorded (2026-11-23; docs/measurements/planner/plan_megatron_deepspeed_guide.txt): all nine layouts fit their GPUs;
13B as TP1 PP4 DP4 on 16 x A100 80GB only with selective recompute (46.0 GB; without it the
attention scores and dropout do not fit). The planner keeps the guide's layout for the six
125M/1.3B rows and would run 13B as TP1 PP2 CP2 DP4 (16 GPUs, 65.7 GB, 1% faster), TP1 PP4 DP8
(32 GPUs, 74.4 GB, 0.3% slower but within the 1% tolerance and simpler: 4 GPUs per replica, not
8) and TP1 PP8 CP2 DP4 (64 GPUs, 30.3 GB, 3% faster than the guide's TP4 PP4 DP4, whose TP
all-reduces the model does not overlap in plain Megatron).
"""

from __future__ import annotations

import pandas as pd

from mlrepro.plan import hardware, search, workloads

# (config file, size, GPU memory GB, GPUs, TP, PP, DP)
GUIDE_LAYOUTS = [
    ("gpt-125m.yaml", "gpt-126m", 40, 1, 1, 1, 1),
    ("gpt-125m-2xdp.yaml", "gpt-126m", 40, 2, 1, 1, 2),
    ("gpt-125m-4xdp.yaml", "gpt-126m", 40, 4, 1, 1, 4),
    ("gpt-1-3b-4xdp.yaml", "gpt-1.3b", 40, 4, 1, 1, 4),
    ("gpt-1-3b-8xdp.yaml", "gpt-1.3b", 40, 8, 1, 1, 8),
    ("gpt-1-3b-4xdp-4xpp.yaml", "gpt-1.3b", 40, 16, 1, 4, 4),
    ("gpt-13b-4xdp-4xpp.yaml", "gpt-13b", 80, 16, 1, 4, 4),
    ("gpt-13b-4xdp-8xpp.yaml", "gpt-13b", 80, 32, 1, 8, 4),
    ("gpt-13b-4xdp-4xpp-4xtp.yaml", "gpt-13b", 80, 64, 4, 4, 4),
]


def workload(size: str) -> workloads.Workload:
    return workloads.gpt(size, flash_attention=False, dropout=True)


def check(row) -> dict:
    name, size, mem, gpus, tp, pp, dp = row
    facts = hardware.a100(mem, gpus)
    w = workload(size)
    out = {"config": name, "gpus": f"{gpus}x A100 {mem}GB", "layout": f"TP{tp} PP{pp} DP{dp}", "gbs": w.gbs}
    try:
        own = search.plan(w, facts, fixed={"tp": tp, "pp": pp, "cp": 1, "dp": dp}, top=1)
        lay = own.layout
        out.update(fits=True, as_run=f"MBS{lay.mbs} recompute={lay.recompute}" + (" SP" if lay.sp else ""),
                   memory_gb=round(own.best.memory_gb, 1), step_s=round(own.best.objective_s, 2))
    except search.PlanError as exc:
        out.update(fits=False, as_run=str(exc).split(": ", 1)[1][:90], memory_gb=None, step_s=None)
    best = search.plan(w, facts, top=1)
    out.update(planner=best.layout.short(), planner_memory_gb=round(best.best.memory_gb, 1),
               planner_step_s=round(best.best.objective_s, 2))
    return out


def table() -> pd.DataFrame:
    return pd.DataFrame([check(r) for r in GUIDE_LAYOUTS])


if __name__ == "__main__":
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        print(table().to_string(index=False))
