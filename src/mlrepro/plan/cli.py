"""`mlrepro plan`: the best layouts for a benchmark or a GPT size on a system, and why not the others.

    mlrepro plan --benchmark llama2_70b_lora --system gb200-nvl72
    mlrepro plan --model gpt-13b --gpus 64 --system dgxh100-64x8 --gbs 1024
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

from mlrepro import config as mlrepro_config
from mlrepro.util import fsutil
from mlrepro.plan import generate, goodput, hardware, search, workloads, writer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--benchmark", help="an MLPerf benchmark (llama2_70b_lora, llama31_405b) or a config/benchmarks name")
    what.add_argument("--model", help="a GPT size for Megatron-LM pretraining, e.g. gpt-1.3b, gpt-175b")
    parser.add_argument("--system", required=True, help="config/systems/<name>.yaml, with its hardware: figures")
    parser.add_argument("--gpus", type=int, help="plan for this many GPUs of the system's kind instead of all of it")
    parser.add_argument("--gbs", type=int, help="global batch size, sequences (GPT; default: the GPT-3 paper's)")
    parser.add_argument("--dropout", action="store_true",
                        help="GPT: train with dropout (its masks are stored; default: none, and the Megatron-LM "
                             "arguments say --attention-dropout 0 --hidden-dropout 0)")
    parser.add_argument("--margin", type=float, default=search.DEFAULT_MARGIN,
                        help="share of GPU memory a plan may fill (default %(default)s)")
    parser.add_argument("--mfu", type=float,
                        help="model FLOPs utilisation of the datasheet peak to assume (default: the baseline stage's "
                             "measured one, else preflight's matmul rate x 0.704, else the system's, else 0.484)")
    parser.add_argument("--datasheet", action="store_true",
                        help="plan with the system file's figures only, not those measured under results/")
    parser.add_argument("--top", type=int, default=10, help="plans to list (default %(default)s)")
    parser.add_argument("--write", type=Path, metavar="DIR",
                        help="write the winner into DIR: a config_<SYS>.sh for an NVIDIA benchmark (DIR should hold "
                             "the implementation's config_common.sh and a published config to start from), or "
                             "megatron_<model>_<N>gpus.args for a GPT size")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: the current folder)")


def resolve_benchmark(root: Path, name: str, gbs: int | None = None) -> workloads.Workload:
    """An MLPerf name, or a config/benchmarks/<name>.yaml that names one."""
    if name in workloads.BENCHMARKS:
        return workloads.BENCHMARKS[name]
    path = root / "config" / "benchmarks" / f"{name}.yaml"
    if path.is_file():
        record = mlrepro_config.load_yaml(path) or {}
        if record.get("pretrain"):  # a GPT pretraining benchmark: its model at its global batch (or --gbs)
            return workloads.gpt(record["pretrain"]["model"], gbs or record["pretrain"].get("gbs"))
        mlperf = record.get("mlperf_benchmark")
        if mlperf in workloads.BENCHMARKS:
            return workloads.BENCHMARKS[mlperf]
        raise search.PlanError(f"{path}: mlperf_benchmark is {mlperf!r}; the planner has rules for "
                               f"{', '.join(workloads.BENCHMARKS)}")
    raise search.PlanError(f"unknown benchmark {name!r}: the planner has rules for {', '.join(workloads.BENCHMARKS)}")


def make_plan(args: argparse.Namespace) -> search.Plan:
    facts = hardware.load(args.root, args.system, measured=not args.datasheet)
    if args.mfu:
        facts = facts.with_mfu(args.mfu, "--mfu")
    if args.gpus:
        facts = facts.with_gpus(args.gpus)
    if args.benchmark:
        work = resolve_benchmark(args.root, args.benchmark, args.gbs)
        if args.gbs and not work.fixed_gbs:
            raise search.PlanError("--gbs applies to --model; a benchmark's GBS follows its rule (MINIBS x DP)")
        if args.dropout:
            raise search.PlanError("--dropout applies to --model (a GPT size); a benchmark is planned as its "
                                   "workload in mlrepro/plan/workloads.py describes it")
    else:
        try:
            work = workloads.gpt(args.model, args.gbs, dropout=args.dropout)
        except KeyError as exc:
            raise search.PlanError(str(exc.args[0])) from None
    return search.plan(work, facts, margin=args.margin, top=args.top)


def expected_failures(plan: search.Plan) -> dict | None:
    """The chosen layout's expected failures at the plan's scale (the objective includes them): a GPT of a
    fixed global batch saving at the Young/Daly interval, a benchmark's timed run, which never saves."""
    model, facts, best = plan.facts.failures, plan.facts, plan.best
    if model is None:
        return None
    step = best.parts.step(best.ga, best.base.pp, best.base.vpp).total
    per_step = best.steps is None
    job = model.job(nodes=facts.nodes, gpus=facts.gpus, work_s=step * (best.steps or 1),
                    checkpoint_bytes=goodput.checkpoint_bytes(plan.workload), progress_interval_s=step, saves=per_step)
    e = goodput.steady(job) if per_step else goodput.expected(job)
    return {"nodes": facts.nodes, "mtbf_hours": job.mtbf_s / 3600, "restart_s": job.restart_s,
            "checkpoint_s": job.checkpoint_s if per_step else None,
            "interval_minutes": e.interval_s / 60 if per_step else None,
            "interruptions": None if per_step else e.interruptions, "effective": e.effective}


def failures_line(f: dict) -> str:
    head = f"failures: MTBF {f['mtbf_hours']:,.1f} h on {f['nodes']} node(s), restart {f['restart_s']:.0f} s"
    if f["interval_minutes"] is not None:
        return (f"{head}, a save {f['checkpoint_s']:.1f} s: checkpoint every {f['interval_minutes']:.1f} min "
                f"(Young/Daly), expected effective training time {f['effective']:.1%} (the step times below "
                "are divided by it in objective_s)")
    return (f"{head}: a timed run does not save; expected {f['interruptions']:.3g} interruptions, each starting "
            f"it over, effective training time {f['effective']:.1%} (included in objective_s)")


def run(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
    except (search.PlanError, hardware.HardwareUnknown, mlrepro_config.ConfigError, ValueError) as exc:
        print(f"mlrepro plan: {exc}", file=sys.stderr)
        return 2
    written = None
    if args.write and plan.workload.writer == "nvidia":
        written = writer.write_nvidia_config(plan, args.write, template=generate.nearest_template(args.write, plan))
    elif args.write:
        written = Path(args.write) / f"megatron_{plan.workload.name}_{plan.facts.gpus}gpus.args"
        fsutil.atomic_write_text(written, shlex.join(writer.megatron_args(plan)) + "\n")
    if args.json:
        print(json.dumps({
            "workload": plan.workload.name, "system": plan.facts.name, "gpus": plan.facts.gpus,
            "figures": plan.facts.figures(),
            "best": plan.table.iloc[0].to_dict(), "plans": plan.table.to_dict(orient="records"),
            "rejected": dict(+plan.rejected), "evaluated": plan.evaluated,
            "solve_seconds": round(plan.solve_seconds, 3), "failures": expected_failures(plan),
            "megatron_args": writer.megatron_args(plan) if plan.workload.writer == "megatron" else None,
            "written": str(written) if written else None,
        }, indent=2, default=str))
        return 0
    print(f"{plan.workload.name} on {plan.facts.gpus} x {plan.facts.gpu} ({plan.facts.name}): "
          f"{plan.evaluated} layouts priced in {plan.solve_seconds:.2f} s; memory limit "
          f"{plan.facts.gpu_memory_gb:.4g} GB x {plan.margin:g}, MFU {plan.facts.mfu:.3g}")
    print(f"best: {plan.layout.short()}")
    if (failures := expected_failures(plan)) is not None:
        print(failures_line(failures))
    print(f"(rank 1 is the simplest plan within {search.DEFAULT_TOLERANCE:.0%} of the fastest; the rest by objective:"
          " time to train for a benchmark, step time for a fixed GBS)\n")
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 120):
        print(plan.table.to_string(index=False))
        print("\nfigures the plan rests on:")
        figures = pd.DataFrame(plan.facts.figures())
        figures["value"] = figures["value"].map(lambda v: f"{v:g}" if isinstance(v, (int, float)) else str(v))
        print(figures.to_string(index=False))
        print("\nrejected:")
        print(plan.rejected_table().to_string(index=False))
    if plan.workload.writer == "megatron":
        print("\nMegatron-LM arguments:\n  " + shlex.join(writer.megatron_args(plan)))
    if written:
        print(f"\nwrote {written}")
    return 0
