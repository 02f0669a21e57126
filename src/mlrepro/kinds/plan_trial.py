"""Trial runs of the planner's top candidates (`mlrepro plan --trial K`): measure, then choose.

The cost model ranks; a few iterations of each of the K best layouts say which one is fastest on
this node. Each candidate runs as an ordinary seed job of the GPT pretraining benchmark, through
the launcher every seed uses (mlrepro.launch.auto: local or Slurm, attempt folders, attempt.json
with what it cost), for `iterations` iterations of Megatron-LM on the benchmark's corpus blend, its
log read by mlrepro.scoring.megatron_log. The measured fastest is chosen.

Where it is kept (paths.trials_dir): results/<benchmark>/trials/<layout>/ is a candidate's seed-like
folder, whose GPU-hours scoring.cost.benchmark_cost adds to the benchmark's cost, and
results/<benchmark>/trials/trials.json holds every candidate's predicted and measured step time,
its GPU-hours, and the choice. Each measured step also becomes an observation of the system
(mlrepro.plan.calibration.observe), so the next plan starts from it.

This module is also the command `mlrepro plan` (plan.cli, and --trial, which needs the launcher,
a layer above the planner).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.kinds import megatron as megatron_kind
from mlrepro.launch import auto, job
from mlrepro.plan import calibration, hardware, search
from mlrepro.plan import cli as plan_cli
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_launch, megatron_plan
from mlrepro.scoring import cost, megatron_log, megatron_score
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

ITERATIONS = 10  # per candidate: Megatron's first iterations are warm-up, its steady state follows
TRIALS_JSON = "trials.json"


@dataclasses.dataclass(frozen=True)
class Trial:
    layout: Layout
    predicted_s: float
    rank: int

    @property
    def tag(self) -> str:
        lay = self.layout
        return (f"tp{lay.tp}pp{lay.pp}dp{lay.dp}mbs{lay.mbs}" + (f"vpp{lay.vpp}" if lay.vpp > 1 else "")
                + ("sp" if lay.sp else "") + (f"rc{lay.recompute}" if lay.recompute != "none" else ""))


def candidates(plan: search.Plan, k: int) -> list[Trial]:
    """The K best distinct layouts of the plan's table (rank 1 first)."""
    out, seen = [], set()
    for row in plan.table.to_dict(orient="records"):
        lay = Layout(tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]), dp=int(row["dp"]), mbs=int(row["mbs"]),
                     ga=int(row["ga"]), sp=bool(row["sp"]), recompute=str(row["recompute"]), vpp=int(row["vpp"]))
        trial = Trial(lay, float(row["step_s"]), int(row["rank"]))
        if trial.tag not in seen and lay.cp == 1:  # Megatron's GPT launch line has no context parallelism
            seen.add(trial.tag)
            out.append(trial)
        if len(out) == k:
            break
    return out


def trial_plan(settings: mlrepro_config.Settings, benchmark: str, trial: Trial, iterations: int) -> job.SeedPlan:
    """A candidate as a seed job: the benchmark's seed plan (kinds.megatron.plan_seed) with the trial's
    layout, a few iterations, and its own folder under the benchmark's trials/."""
    bench, system, root = settings.benchmark(benchmark), settings.system, settings.root
    variant = next(iter(megatron_plan.variants(bench).values()))
    facts = hardware.from_system(system, root)
    planned = megatron_plan.Planned(variant, facts, trial.layout, 0.0, trial.predicted_s, iterations)
    seed = bench.seeds[0]
    corpus_dir = megatron_plan.benchmark_corpus_dir(root, bench)
    run = megatron_plan.seed_run(planned, seed, corpus_dir, system.scheduler, settings.pretrain_overrides.get("attention"))
    # Every iteration logged (the steady state needs intervals); one evaluation, at the end.
    run = dataclasses.replace(run, train_iters=iterations, warmup_iters=1, log_interval=1, eval_interval=iterations,
                              eval_iters=1)
    folder = paths.trials_dir(root, benchmark) / trial.tag
    lay, per_node = trial.layout, system.gpus_per_node
    nodes = max(1, lay.gpus // per_node)
    env = {"SEED": str(seed), "NEXP": "1", "DGXNNODES": str(nodes), "DGXNGPU": str(min(lay.gpus, per_node)),
           "MEGATRON_DIR": str(megatron_kind.ensure_megatron(settings, benchmark))}
    seed_files = paths.SeedPaths(folder)
    if system.scheduler == "slurm":
        target = seed_files.megatron_args
        env |= {"MEGATRON_ARGS_FILE": str(target), "DATADIR": str(corpus_dir.resolve()),
                "CONT": str(settings.pretrain_overrides.get("image") or "${CONT}")}
        line = shlex.join(megatron_launch.pretrain_args(run))
    else:
        target = seed_files.megatron_launch
        env["MEGATRON_LAUNCH_FILE"] = str(target)
        line = megatron_launch.torchrun_line(run, nproc=lay.gpus)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, line + "\n")
    plan = job.SeedPlan(
        benchmark=benchmark, seed=seed, scheduler=system.scheduler, implementation_dir=bench.implementation_dir,
        config_file=bench.source, dgxsystem=f"trial-{trial.tag}", nodes=nodes, gpus_per_node=min(lay.gpus, per_node),
        walltime_minutes=int(settings.pretrain_overrides.get("walltime_minutes") or 15), seed_dir=folder, env=env,
        job_name=job.job_name(f"{benchmark}-trial-{trial.tag}", seed, folder), gpus=lay.gpus, hang=bench.hang)
    return job.with_sbatch(plan, system)


def measured_step(log_path: Path, trial: Trial, seq: int) -> tuple[float | None, str | None]:
    """(seconds per iteration in the steady state, why none) from the candidate's Megatron log."""
    if not log_path.is_file():
        return None, "no log"
    parsed = megatron_log.parse_log(log_path)
    t = megatron_score.throughput(parsed, gpus=trial.layout.gpus, seq_length=seq, peak_tflops=None)
    if not t["iter_time_s"]:
        return None, "; ".join(parsed.problems[:2]) or "no training iteration in the log"
    return float(t["iter_time_s"]), None


def run_trials(settings: mlrepro_config.Settings, benchmark: str, plan: search.Plan, k: int,
               iterations: int = ITERATIONS) -> dict:
    """Run the top K candidates one after the other, choose the measured fastest, write trials.json."""
    if k < 1:
        raise ValueError("--trial needs at least one candidate")
    system, root = settings.system, settings.root
    trials = candidates(plan, k)
    rows = []
    for trial in trials:
        tplan = trial_plan(settings, benchmark, trial, iterations)
        run_log = tplan.seed_dir / paths.AttemptPaths.RUN_LOG
        job.write_plan(tplan)
        log.info("trial %s: %s (predicted %.4f s/iteration)", trial.tag, trial.layout.short(), trial.predicted_s)
        error = None
        try:
            auto.run_seed_attempts(tplan, system, run_log, None, 0, finish=lambda: None)
        except job.SeedFailed as exc:
            error = str(exc).splitlines()[0]
        measured, why = measured_step(run_log, trial, plan.workload.model.seq)
        spent = cost.seed_cost(cost.seed_attempts(tplan.seed_dir, tplan.gpus_per_node))
        row = {"rank": trial.rank, "tag": trial.tag, "layout": trial.layout.short(),
               "predicted_s": round(trial.predicted_s, 4), "measured_s": round(measured, 4) if measured else None,
               "error_pct": calibration.error_pct(trial.predicted_s, measured) if measured else None,
               "gpu_hours": spent["gpu_hours"], "folder": str(tplan.seed_dir), "error": error or why}
        rows.append(row)
        if measured:
            calibration.observe(root, system.name, calibration.Observation(
                model=plan.workload.model.name, layout=trial.layout, measured_s=measured,
                source=f"trial {benchmark}/{trial.tag}", predicted_s=trial.predicted_s), refit=False)
    done = [r for r in rows if r["measured_s"]]
    chosen = min(done, key=lambda r: r["measured_s"]) if done else None
    record = {"benchmark": benchmark, "system": system.name, "model": plan.workload.model.name,
              "gbs": plan.workload.gbs, "iterations": iterations, "candidates": rows,
              "chosen": chosen and {k: chosen[k] for k in ("tag", "layout", "rank", "predicted_s", "measured_s")},
              "planner_first": rows[0]["tag"] if rows else None,
              "gpu_hours": sum(r["gpu_hours"] for r in rows), "unit": cost.unit(system.device)}
    atomic_write_json(paths.trials_dir(root, benchmark) / TRIALS_JSON, record)
    if done:
        calibration.calibrate_system(root, system.name)  # the next plan starts from what the trials measured
    return record


def read_chosen(root: Path, benchmark: str) -> Layout | None:
    """The layout the benchmark's last trial chose (None: no trial, or none measured)."""
    record = paths.read_json_if_exists(paths.trials_dir(root, benchmark) / TRIALS_JSON) or {}
    chosen = record.get("chosen") or {}
    for row in record.get("candidates") or []:
        if row.get("tag") == chosen.get("tag"):
            return _layout_of(row["layout"])
    return None


def _layout_of(short: str) -> Layout:
    """Layout.short() read back."""
    fields = dict.fromkeys(("TP", "PP", "CP", "DP", "MBS", "GA", "VPP"), 1)
    parts = short.replace("(", " ").replace(")", " ").split()
    for p in parts:
        for key in sorted(fields, key=len, reverse=True):
            if p.startswith(key) and p[len(key):].isdigit():
                fields[key] = int(p[len(key):])
                break
    recompute = next((p.split("=")[1] for p in parts if p.startswith("recompute=")), "none")
    return Layout(tp=fields["TP"], pp=fields["PP"], cp=fields["CP"], dp=fields["DP"], mbs=fields["MBS"],
                  ga=fields["GA"], vpp=fields["VPP"], sp="SP" in parts, recompute=recompute)


# ------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan_cli.add_arguments(parser)
    parser.add_argument("--trial", type=int, metavar="K",
                        help="run the K best layouts for a few iterations each as seed jobs of --benchmark (a GPT "
                             "pretraining benchmark) and choose the measured fastest; their cost counts in the "
                             "benchmark's")
    parser.add_argument("--trial-iterations", type=int, default=ITERATIONS,
                        help="iterations per candidate (default %(default)s)")
    parser.add_argument("--megatron", help="with --trial: a Megatron-LM folder or .tar.gz (default: the benchmark's pin)")


def run(args: argparse.Namespace) -> int:
    if not args.trial:
        return plan_cli.run(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if not args.benchmark:
            raise search.PlanError("--trial runs the candidates as seeds of a benchmark: give --benchmark "
                                   "(a GPT pretraining benchmark, e.g. gpt_126m)")
        root = Path(args.root).resolve()
        settings = mlrepro_config.load({"benchmarks": [args.benchmark], "system": args.system,
                                        "pretrain": {"megatron": args.megatron} if args.megatron else {}}, root)
        if not settings.benchmark(args.benchmark).is_pretrain:
            raise search.PlanError(f"--trial: {args.benchmark} is not a GPT pretraining benchmark (no pretrain: block)")
        plan = plan_cli.make_plan(args)
        record = run_trials(settings, args.benchmark, plan, args.trial, args.trial_iterations)
    except (search.PlanError, mlrepro_config.ConfigError, megatron_plan.Refused, ValueError) as exc:
        print(f"mlrepro plan: {exc}", file=sys.stderr)
        return 2
    print(f"trial of {len(record['candidates'])} candidate(s), {args.trial_iterations} iterations each "
          f"({record['gpu_hours']:.4g} {record['unit']}):")
    for r in record["candidates"]:
        measured = f"{r['measured_s']:.4f}" if r["measured_s"] else f"not measured ({r['error']})"
        error = f" ({r['error_pct']:+.1f}%)" if r["error_pct"] is not None else ""
        print(f"  rank {r['rank']}: {r['layout']}: predicted {r['predicted_s']:.4f} s, measured {measured}{error}")
    chosen = record["chosen"]
    print(f"chosen: {chosen['layout']} (measured fastest)" if chosen else "chosen: none (no candidate measured)")
    print(f"written: {paths.trials_dir(Path(args.root).resolve(), args.benchmark) / TRIALS_JSON}")
    return 0 if chosen else 1
