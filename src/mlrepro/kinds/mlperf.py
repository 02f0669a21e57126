"""The MLPerf kind: an NVIDIA implementation (run_and_time.sh, config_<SYS>.sh) whose seeds log MLLOG.

A seed is one run of the implementation: run_and_time.sh with the environment that
config_<SYS>.sh exports plus DATADIR, MODEL, LOGDIR and SEED, run by mlrepro.launch (submitit
here, run.sub under sbatch on Slurm). The config is the published one that fits the system, or,
where none does and the planner knows the benchmark, one the planner writes (mlrepro plan).
Its result is the run's MLLOG lines, scored by mlrepro.scoring.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import NamedTuple

from mlrepro import paths
from mlrepro.config import Benchmark, ConfigError, Settings, System
from mlrepro.implementation import configs as implementation
from mlrepro.launch import chain, job
from mlrepro.plan import generate, goodput, hardware, search, workloads
from mlrepro.scoring import early_stop, mllog
from mlrepro.scoring import goodput as measured_goodput
from mlrepro.scoring import rules as scoring_rules
from mlrepro.scoring import score as scoring
from mlrepro.util.fsutil import atomic_write_text

@functools.lru_cache(maxsize=64)
def _pick_config(impl_dir: Path, nodes: int, gpus_per_node: int, requested: str | None):
    # Sourcing every config_<SYS>.sh costs a bash each; the DAG asks once per seed and rule.
    return implementation.pick_config(impl_dir, nodes, gpus_per_node, requested=requested)


def implementation_config(bench: Benchmark, system: System):
    """The config_<SYS>.sh this benchmark uses on this system, read and checked against the system."""
    requested = system.implementation_configs.get(bench.name)
    try:
        return _pick_config(bench.implementation_dir, system.nodes, system.gpus_per_node, requested)
    except implementation.ImplementationError as exc:
        if requested:
            raise ConfigError(f"{bench.name} on system {system.name} (config/systems/{system.name}.yaml: "
                              f"implementation_configs.{bench.name}): {exc}") from None
        if not _plannable(bench):
            raise ConfigError(f"{bench.name} on system {system.name}: {exc}") from None
        unfit = exc
    # No published config fits: the planner writes one for this system, which then fits exactly.
    try:
        generate.generate_config(bench, system)
    except (search.PlanError, hardware.HardwareUnknown) as why:
        raise ConfigError(f"{bench.name} on system {system.name}: {unfit}\n"
                          f"mlrepro plan could not generate one either: {why}") from None
    _pick_config.cache_clear()
    return _pick_config(bench.implementation_dir, system.nodes, system.gpus_per_node, None)


def _plannable(bench: Benchmark) -> bool:
    """An NVIDIA benchmark the planner has rules for, with published configs to start from."""
    folder = Path(bench.implementation_dir)
    return (bench.mlperf_benchmark in workloads.BENCHMARKS and folder.is_dir()
            and bool(implementation.list_configs(folder)))


def plan_seed(settings: Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """The seed's plan: run_and_time.sh with the environment config_<SYS>.sh exports, plus the data's
    places, SEED and the chain's settings of a checkpointing benchmark; run.sub's sbatch line on Slurm."""
    return _plan_seeds(settings, benchmark, [seed])[seed]


def _plan_seeds(settings: Settings, benchmark: str, seeds) -> dict[int, job.SeedPlan]:
    """plan_seed of each of `seeds`, with what every seed shares (the config, the stages' recorded
    places, the chain's limits) read once: the DAG plans every seed of a benchmark at once."""
    bench = settings.benchmark(benchmark)
    for seed in seeds:
        if seed not in bench.seeds:
            raise ConfigError(f"seed {seed} is not a seed of {benchmark} (seeds: {list(bench.seeds)})")
    system = settings.system
    cfg = implementation_config(bench, system)
    root = settings.root
    places = {stage: str(paths.stage_location(root, benchmark, stage)) for stage in paths.STAGE_FOLDERS}
    places["corpus"] = str(paths.corpus_dir(root, bench.corpus or "none"))
    shared_env = {
        **cfg.env,
        **bench.env,
        **{key: value.format(**places) for key, value in bench.run_env.items()},
        "DGXSYSTEM": cfg.dgxsystem,
    }
    chain_limits = chain.limits(bench.segments, system.max_job_minutes)
    saving = _saving(settings, bench, cfg, chain_limits) if chain_limits is not None else None
    generated = _generated(cfg.path)
    plans = {}
    for seed in seeds:
        seed_dir = paths.seed_dir(root, benchmark, seed)
        env = {**shared_env, "SEED": str(seed), "NEXP": "1"}
        walltime = cfg.walltime_min
        if chain_limits is not None:  # a checkpointing pretraining run: each job is one segment of the seed
            env.update(chain.run_env(chain_limits, seed_dir))
            env.update(saving.env)
            walltime = chain.walltime_minutes(chain_limits, walltime)
        plan = job.SeedPlan(
            benchmark=benchmark,
            seed=seed,
            scheduler=system.scheduler,
            implementation_dir=cfg.path.parent,
            config_file=cfg.path,
            dgxsystem=cfg.dgxsystem,
            nodes=cfg.nodes,
            gpus_per_node=cfg.gpus_per_node,
            walltime_minutes=walltime,
            seed_dir=seed_dir,
            env=env,
            job_name=job.job_name(benchmark, seed, seed_dir),
            generated=generated,
            hang=bench.hang,
            inject_failures=bench.inject_failures,
            save_signal_s=chain_limits.save_signal_seconds if chain_limits else 0,
            checkpoint_interval=saving.record if saving else None,
        )
        plan = job.with_sbatch(plan, system)
        if saving:
            plan = dataclasses.replace(plan, description=f"{plan.describe()} | {saving.line}")
        plans[seed] = plan
    return plans


class _Saving(NamedTuple):
    env: dict[str, str]  # the interval the trainer is told (nothing: its own, or the benchmark's env: stands)
    line: str  # the dry run's failures line
    record: dict  # plan.json's checkpoint_interval


def _saving(settings: Settings, bench: Benchmark, cfg, limits: chain.Limits) -> _Saving:
    """How often a benchmark that saves (a `segments:` block) checkpoints, and what failures are expected to
    cost it: the system's failure model with the restart and checkpoint costs its seeds measured so far
    (mlrepro.scoring.goodput), at the seeds' measured step time, else the reference runs'; the run as long as
    the reference's runs (else the seeds', else MAX_STEPS). The interval is the benchmark's own (its `env:`
    sets segments.interval_env), else Young/Daly's in whole steps."""
    root, system = settings.root, settings.system
    measured = measured_goodput.benchmark_goodput(paths.benchmark_dir(root, bench.name), cfg.gpus_per_node) or {}
    ref_pace, ref_steps = measured_goodput.run_pace(
        early_stop.reference_scores(root, bench, scoring_rules.for_benchmark(bench)))
    pace, pace_from = ((measured["step_s"], "measured on the seeds") if measured.get("step_s")
                       else (ref_pace, "the reference runs'"))
    seeds_steps = [g["productive_steps"] for g in (measured.get("seeds") or {}).values()
                   if g.get("finished") and g.get("productive_steps")]
    steps = ref_steps or (max(seeds_steps) if seeds_steps else None) or int(cfg.env.get("MAX_STEPS") or 0) or None
    var = bench.segments.get("interval_env")
    own = bench.env.get(var) if var else None
    if own is not None:
        try:
            given = int(own)
        except ValueError:
            raise ConfigError(f"config/benchmarks/{bench.name}.yaml: env: {var}={own!r} is not a whole number of "
                              "steps (segments: interval_env names it as the checkpoint interval)") from None
    if not pace or not steps:
        by = (f"config/benchmarks/{bench.name}.yaml's env: {var}" if own is not None
              else "the implementation's own: no reference runs and no seed give the step time yet")
        return _Saving({}, f"failures: not priced: no step time yet (no reference runs, no seed measured); "
                           f"checkpoint interval {by}", {"steps": given if own is not None else None,
                                                          "seconds": None, "chosen_by": by})
    model = goodput.FailureModel.of(system.failures, f"config/systems/{system.name}.yaml", hang=bench.hang)
    model = model.with_measured(restart_seconds=measured.get("restart_cost_s"),
                                checkpoint_seconds=measured.get("checkpoint_cost_s"))
    workload = workloads.BENCHMARKS.get(bench.mlperf_benchmark or "")
    size = goodput.checkpoint_bytes(workload) if workload else None
    span = limits.training_seconds
    run = model.job(nodes=cfg.nodes, gpus=cfg.nodes * cfg.gpus_per_node, work_s=steps * pace,
                    checkpoint_bytes=size or 0.0, progress_interval_s=pace, job_limit_s=span)
    young_daly = max(1, round(goodput.young_daly_interval(run) / pace))
    env = {}
    default = cfg.env.get(var) if var else None
    if own is not None:
        chosen, by = given, f"config/benchmarks/{bench.name}.yaml's env: {var}"
    elif not var:
        chosen, by = None, "the implementation's own: segments: names no interval_env to give it Young/Daly's"
    elif young_daly >= steps and default and default.isdigit():
        # Young/Daly's interval spans the whole run (the default 6.5 failures per 1,000 node-days on a node
        # or two: an MTBF of months against a run of minutes): saving more often than the implementation's
        # own interval buys nothing the plan can see, and that interval is what its resumes (and the
        # miniature's tests of them) are built around; it stays.
        chosen, by = int(default), f"the implementation's {var}: Young/Daly's interval is the whole run"
    else:
        chosen, by = min(young_daly, steps), "Young/Daly"
        env = {var: str(chosen)}
    interval_s = chosen * pace if chosen else None
    e = goodput.expected(run, interval_s)
    every = f"every {chosen:,} steps ({interval_s:.1f} s" if chosen else "the implementation's own interval ("
    line = (f"failures: {goodput.costs_words(model, run, size)}: checkpoint {every} at {pace:.3g} s a step, "
            f"{pace_from}; {by}); expected {e.interruptions:.2g} interruptions in a run of {steps:,} steps, "
            f"effective training time {e.effective:.1%}")
    return _Saving(env, line, {"steps": chosen, "seconds": round(interval_s, 3) if interval_s else None,
                               "chosen_by": by, "young_daly_steps": young_daly})


def finish_seed(bench: Benchmark, plan: job.SeedPlan, run_log: Path, out: Path) -> None:
    """Turn a finished run's log into the seed's mllog.txt (`out`), or record why it is not a result."""
    parsed = mllog.parse_text(run_log.read_text(errors="replace") if run_log.exists() else "", source=str(run_log))
    stop = parsed.last("run_stop")
    if parsed.first("run_start") is None or stop is None:
        missing = "run_start" if parsed.first("run_start") is None else "run_stop"
        job.record_failure(plan.seed_dir, f"no {missing} in the run's MLLOG", state="INCOMPLETE_LOG")
        raise job.SeedFailed(f"seed {plan.seed}: the run's log has no {missing}; see {run_log}")
    status = (stop.metadata or {}).get("status")
    if status != "success" and bench.not_converged == "rerun":
        job.record_failure(plan.seed_dir, f"run_stop status {status!r}", state="ABORTED")
        raise job.SeedFailed(f"seed {plan.seed}: run_stop status {status!r} (benchmark reruns non-converged seeds)")
    atomic_write_text(out, parsed.to_text())
    job.clear_failure(plan.seed_dir)


def _generated(config_path: Path) -> bool:
    return generate.is_generated(config_path)


def implementation_known(root: Path, bench: Benchmark) -> bool:
    """A local implementation folder is always known; a git one once it is fetched."""
    return bench.implementation_git is None or paths.implementation_record(root, bench.name).exists()


def implementation_folder(bench: Benchmark, system: System) -> Path:
    """The folder the seeds run and the image is built from: the config's, which fits the system."""
    return implementation_config(bench, system).path.parent


def corpus_folder(root: Path, bench: Benchmark) -> Path | None:
    """The pretraining corpus a seed reads (its blend is an input of the seed), if the benchmark names one."""
    return paths.corpus_dir(root, bench.corpus) if bench.corpus else None


def dag_plan(settings: Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """What the DAG shows and reserves for a seed. Until a git implementation is fetched its configs
    are unknown: Snakemake asks before the checkpoint has run, gets a placeholder, and asks again."""
    bench = settings.benchmark(benchmark)
    if not implementation_known(settings.root, bench):
        seed_dir = paths.seed_dir(settings.root, benchmark, seed)
        # An unknown scheduler: one thread and 100 MB reserved, as a seed that only waits.
        return job.SeedPlan(benchmark=benchmark, seed=seed, scheduler="unknown", implementation_dir=Path(),
                            config_file=Path(), dgxsystem="", nodes=1, gpus_per_node=1, walltime_minutes=60,
                            seed_dir=seed_dir, env={},
                            description="shape known once the implementation is fetched")
    return plan_seed(settings, benchmark, seed)


def dag_plans(settings: Settings, benchmark: str) -> dict[int, job.SeedPlan]:
    """dag_plan of every seed the benchmark lists, planned together (what they share is read once)."""
    bench = settings.benchmark(benchmark)
    if not implementation_known(settings.root, bench):
        return {seed: dag_plan(settings, benchmark, seed) for seed in bench.seeds}
    return _plan_seeds(settings, benchmark, bench.seeds)


def prepare(settings: Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """The plan the seed runs; an MLPerf seed has nothing to put in place beyond it."""
    return plan_seed(settings, benchmark, seed)


def score_seed(settings: Settings, bench: Benchmark, seed: int, log_path: Path, plan: job.SeedPlan | None) -> dict:
    """The seed's run record from its MLLOG (the plan is not needed: MLLOG says everything)."""
    return scoring.score_run(log_path, scoring_rules.for_benchmark(bench), seed=seed)


def unmet(root: Path, bench: Benchmark, system: System, *, with_implementation: bool) -> list[str]:
    """What the system lacks for the benchmark beyond its `requires:`: a config that fits (once known)."""
    if not with_implementation:
        return []
    try:
        implementation_config(bench, system)
    except ConfigError as exc:
        return [str(exc).removeprefix(f"{bench.name} on system {system.name}: ")]
    return []


def config_in_use(bench: Benchmark, system: System) -> dict | None:
    """The implementation config the runs use, {"file", "generated"} (by mlrepro plan); None if none fits."""
    try:
        config_path = implementation_config(bench, system).path
    except ConfigError:
        return None
    return {"file": config_path.name, "generated": _generated(config_path)}


def check_target(bench: Benchmark, system: System) -> None:
    """The implementation stops at its own TARGET_EVAL_LOSS; a benchmark file that scores another target
    would call every run unconverged (or converged too early) once the seeds have trained."""
    cfg = implementation_config(bench, system)
    given = bench.env.get("TARGET_EVAL_LOSS", cfg.env.get("TARGET_EVAL_LOSS"))
    if given is None:
        return
    try:
        theirs = float(given)
    except ValueError:
        return  # not a number: the implementation's own check says so when it starts
    ours = float(bench.target["value"])
    if abs(theirs - ours) > 1e-9 * max(1.0, abs(ours)):
        raise ConfigError(f"{bench.source.relative_to(bench.source.parents[2])}: target.value {ours:g} contradicts the "
                          f"implementation's TARGET_EVAL_LOSS={given} ({cfg.path.name}): its runs stop at their own "
                          f"target; make them equal (or set env: TARGET_EVAL_LOSS)")
