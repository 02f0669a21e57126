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
from mlrepro.plan import calibration, hardware, search, workloads
from mlrepro.plan import cli as plan_cli
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_launch, megatron_plan
from mlrepro.scoring import cost, megatron_log, megatron_score
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

ITERATIONS = megatron_plan.TRIAL_ITERATIONS  # per candidate, the first quarter of them left out as warm-up


@dataclasses.dataclass(frozen=True)
class Trial:
    layout: Layout
    predicted_s: float
    rank: int
    memory_gb: float = 0.0

    @property
    def tag(self) -> str:
        lay = self.layout
        return (f"tp{lay.tp}pp{lay.pp}dp{lay.dp}mbs{lay.mbs}" + (f"vpp{lay.vpp}" if lay.vpp > 1 else "")
                + ("sp" if lay.sp else "") + (f"rc{lay.recompute}" if lay.recompute != "none" else ""))


def candidates(plan: search.Plan, k: int, mbs: int | None = None) -> list[Trial]:
    """The K best distinct layouts of the plan's table (rank 1 first); with `mbs`, only those of that
    micro-batch (the workflow's `pretrain: mbs` sets the seeds', so a trial of another would not be what they run)."""
    out, seen = [], set()
    for row in plan.table.to_dict(orient="records"):
        lay = Layout(tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]), dp=int(row["dp"]), mbs=int(row["mbs"]),
                     ga=int(row["ga"]), sp=bool(row["sp"]), recompute=str(row["recompute"]), vpp=int(row["vpp"]))
        trial = Trial(lay, float(row["step_s"]), int(row["rank"]), float(row["memory_gb"]))
        if trial.tag not in seen and lay.cp == 1 and mbs in (None, lay.mbs):  # Megatron's GPT line has no CP
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
    # Every iteration logged, so the warm-up can be left out of the measurement (steady_step), and no
    # evaluation (--eval-iters 0, its interval beyond the run): on 2x H200 a 20-iteration trial that
    # evaluated once and was measured from its second interval read 0.142 s for a 0.076 s step.
    run = dataclasses.replace(run, train_iters=iterations, warmup_iters=1, log_interval=1,
                              eval_interval=iterations + 1, eval_iters=0)
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


def warmup(iterations: int) -> int:
    """The iterations a trial leaves out of its measurement: the first quarter, at least Megatron's first
    interval and the one after it (the allocator and the first gradient reduce settle there)."""
    return max(megatron_score.STEADY_SKIP, iterations // 4)


def steady_step(parsed: megatron_log.TrainingLog, skip: int) -> float | None:
    """Seconds per iteration in the steady state: the median over the iterations after the first `skip`
    (Megatron logs each one's time with --log-interval 1); None with none left."""
    times = sorted(i.iter_ms for i in parsed.iterations if i.iteration > skip and i.iter_ms)
    if not times:
        return None
    mid = len(times) // 2
    return (times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2) / 1000


def measured_step(log_path: Path, iterations: int) -> tuple[float | None, str | None]:
    """(seconds per iteration in the steady state, why none) from the candidate's Megatron log."""
    if not log_path.is_file():
        return None, "no log"
    parsed = megatron_log.parse_log(log_path)
    step = steady_step(parsed, warmup(iterations))
    if step is None:
        return None, "; ".join(parsed.problems[:2]) or f"no training iteration after the first {warmup(iterations)}"
    return step, None


def benchmark_plan(settings: mlrepro_config.Settings, benchmark: str, top: int) -> search.Plan:
    """The planner's table for the benchmark's trial in the workflow: its model at the seeds' global
    batch (megatron_plan.trial_gbs) on the system, `top` rows."""
    bench = settings.benchmark(benchmark)
    facts = hardware.from_system(settings.system, settings.root)
    work = workloads.gpt(bench.pretrain["model"], megatron_plan.trial_gbs(bench, settings.pretrain_overrides))
    return search.plan(work, facts, top=top)


def run_benchmark_trial(settings: mlrepro_config.Settings, benchmark: str) -> dict:
    """The trial a benchmark's `pretrain: trial:` asks for (the workflow's rule `trial`): trials.json
    written; job.SeedFailed when no candidate was measured (the seeds would have nothing to run)."""
    trial = megatron_plan.trial_of(settings.benchmark(benchmark))
    k, iterations = int(trial["candidates"]), int(trial.get("iterations", ITERATIONS))
    mbs = settings.pretrain_overrides.get("mbs")
    # Rows enough that K distinct layouts remain after those the launch line cannot run are left out.
    plan = benchmark_plan(settings, benchmark, top=max(10, 4 * k))
    record = run_trials(settings, benchmark, plan, k, iterations, mbs=int(mbs) if mbs else None)
    if record["chosen"] is None:
        raise job.SeedFailed(f"{benchmark}: no candidate of the trial was measured: "
                             + "; ".join(f"{r['tag']}: {r['error']}" for r in record["candidates"]))
    return record


def run_trials(settings: mlrepro_config.Settings, benchmark: str, plan: search.Plan, k: int,
               iterations: int = ITERATIONS, *, mbs: int | None = None) -> dict:
    """Run the top K candidates one after the other, choose the measured fastest, write trials.json."""
    if k < 1:
        raise ValueError("--trial needs at least one candidate")
    if iterations <= warmup(iterations):
        raise ValueError(f"a trial of {iterations} iterations leaves none after its warm-up")
    system, root = settings.system, settings.root
    trials = candidates(plan, k, mbs)
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
        measured, why = measured_step(run_log, iterations)
        spent = cost.seed_cost(cost.seed_attempts(tplan.seed_dir, tplan.gpus_per_node))
        row = {"rank": trial.rank, "tag": trial.tag, "layout": trial.layout.short(),
               "predicted_s": round(trial.predicted_s, 4), "measured_s": round(measured, 6) if measured else None,
               "memory_gb": trial.memory_gb,
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
              "gbs": plan.workload.gbs, "iterations": iterations, "measured_after": warmup(iterations),
              "candidates": rows,
              "chosen": chosen and {k: chosen[k] for k in ("tag", "layout", "rank", "predicted_s", "measured_s")},
              "planner_first": rows[0]["tag"] if rows else None,
              "gpu_hours": sum(r["gpu_hours"] for r in rows), "unit": cost.unit(system.device)}
    atomic_write_json(paths.trials_json(root, benchmark), record)
    if done:
        calibration.calibrate_system(root, system.name)  # the next plan starts from what the trials measured
    return record


def read_chosen(root: Path, benchmark: str) -> Layout | None:
    """The layout the benchmark's last trial chose (None: no trial, or none measured)."""
    record = paths.read_json_if_exists(paths.trials_json(root, benchmark)) or {}
    chosen = record.get("chosen") or {}
    row = next((r for r in record.get("candidates") or [] if r.get("tag") == chosen.get("tag")), None)
    return megatron_plan.read_layout(row["layout"]) if row else None


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
    parser.add_argument("--configfile", help="with --trial: the workflow's config file whose `pretrain:` block the seeds "
                                             "run with (attention, image, ...), so the candidates run as they would")


def trial_settings(args: argparse.Namespace) -> mlrepro_config.Settings:
    """The settings the candidates run under: --configfile's `pretrain:` block (less the layout and trial keys,
    which the trial decides) and --megatron, checked as the workflow checks them."""
    pretrain = {}
    if args.configfile:
        data = mlrepro_config.load_yaml(Path(args.configfile))
        block = data.get("pretrain") if isinstance(data, dict) else None
        pretrain = {k: v for k, v in (block or {}).items() if k not in ("layout", "trial")}
    if args.megatron:
        pretrain["megatron"] = args.megatron
    return mlrepro_config.load({"benchmarks": [args.benchmark], "system": args.system, "pretrain": pretrain},
                               Path(args.root).resolve())


def run(args: argparse.Namespace) -> int:
    if not args.trial:
        return plan_cli.run(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if not args.benchmark:
            raise search.PlanError("--trial runs the candidates as seeds of a benchmark: give --benchmark "
                                   "(a GPT pretraining benchmark, e.g. gpt_126m)")
        settings = trial_settings(args)
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
    print(f"written: {paths.trials_json(Path(args.root).resolve(), args.benchmark)}")
    return 0 if chosen else 1
