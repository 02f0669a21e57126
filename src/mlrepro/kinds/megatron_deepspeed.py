"""The Megatron-DeepSpeed kind: a seed of a benchmark with `launcher: megatron-deepspeed` (the
Megatron-DeepSpeed guide's stack), run by mlrepro.launch like a Megatron-LM seed.

The layout, iterations, wall time, corpus and failures are the Megatron-LM kind's (megatron_plan);
what differs is what runs: deepspeedai/Megatron-DeepSpeed at the benchmark's pinned commit with
implementations/megatron_deepspeed/patches applied (in resources/<benchmark>/megatron-deepspeed/),
its pretrain_gpt.py flags and the seed's ds_config.json (checked against each other before any job),
ZeRO for the optimizer state, and its log and tfevents (seed folder's tensorboard/) for the score.
A chained seed saves in DeepSpeed's layout (checkpoints/global_step<N>/, `latest`), and each job is
stopped by the fork's own clock (--exit-duration-in-mins): its signal handler catches SIGTERM only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.kinds import megatron as megatron_kind
from mlrepro.launch import chain, job
from mlrepro.plan import cost, models, workloads
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_deepspeed as mds
from mlrepro.pretrain import megatron_plan
from mlrepro.scoring import megatron_deepspeed_log, megatron_log, megatron_score, tfevents
from mlrepro.scoring import rules as scoring_rules
from mlrepro.util.fsutil import atomic_write_text

log = logging.getLogger(__name__)

# What the Megatron-LM kind's own functions already do for this one: the folder, the corpus, what a system lacks.
implementation_folder = megatron_kind.implementation_folder
corpus_folder = megatron_kind.corpus_folder
unmet = megatron_kind.unmet


def _planned(settings: mlrepro_config.Settings, bench: mlrepro_config.Benchmark) -> megatron_plan.Planned:
    overrides = settings.pretrain_overrides
    try:
        return megatron_plan.shaped(megatron_plan.chosen(settings.root, bench, settings.system.name, overrides),
                                    overrides)
    except megatron_plan.Refused as exc:
        raise mlrepro_config.ConfigError(str(exc)) from None


def plan_seed(settings: mlrepro_config.Settings, benchmark: str, seed: int, *,
              prepared: bool = True) -> job.SeedPlan:
    """The seed's plan: run_and_time.sh of implementations/megatron_deepspeed with the seed's line; the
    ds_config and the line checked against each other here, so a mismatch stops the DAG."""
    bench, system, root = settings.benchmark(benchmark), settings.system, settings.root
    if seed not in bench.seeds:
        raise mlrepro_config.ConfigError(f"seed {seed} is not a seed of {benchmark} (seeds: {list(bench.seeds)})")
    overrides = settings.pretrain_overrides
    p = _planned(settings, bench)
    if p.variant.launcher != "megatron-deepspeed":
        raise mlrepro_config.ConfigError(f"{benchmark}: layout {p.variant.name} has launcher {p.variant.launcher}; "
                                         "this kind runs launcher: megatron-deepspeed layouts only")
    corpus_dir = megatron_plan.benchmark_corpus_dir(root, bench)
    files = paths.SeedPaths.of(root, benchmark, seed)
    seed_dir, lay, per_node = files.folder, p.layout, system.gpus_per_node
    nodes, slurm = max(1, lay.gpus // per_node), system.scheduler == "slurm"
    limits, measured, save, interval = megatron_kind.checkpointing(settings, benchmark, p, files)
    ds_path = seed_dir / "ds_config.json"
    # Checked in every mode: the DAG's plan (prepared=False) is made before any job is submitted.
    run = megatron_plan.seed_run(p, seed, corpus_dir, system.scheduler, overrides.get("attention"), prepared=prepared,
                                 **save)
    args = mds.seed_args(run, megatron_plan.ds_config(p), zero_stage=p.variant.zero_stage,
                         where=megatron_plan.ds_where(p.variant), ds_config_path=str(ds_path),
                         tensorboard_dir=str(paths.SeedPaths(seed_dir).tensorboard))
    env = {"SEED": str(seed), "NEXP": "1", "DGXNNODES": str(nodes), "DGXNGPU": str(min(lay.gpus, per_node)),
           "MEGATRON_DIR": str(source_dir(root, benchmark)), "DS_CONFIG": str(ds_path),
           "DS_CONFIG_JSON": json.dumps(megatron_plan.ds_config(p), sort_keys=True)}
    walltime = megatron_plan.job_minutes(p, overrides)
    if limits is not None:
        env |= chain.run_env(limits, seed_dir)
        walltime = chain.walltime_minutes(limits, walltime)
    description = ""
    if prepared:
        if slurm:
            env |= {"MEGATRON_ARGS_FILE": str(files.megatron_args), "DATADIR": str(corpus_dir.resolve()),
                    "CONT": str(overrides.get("image") or "${CONT}")}
            env["MEGATRON_LINE"] = shlex.join(args)
        else:
            env["MEGATRON_LAUNCH_FILE"] = str(files.megatron_launch)
            env["MEGATRON_LINE"] = mds.torchrun_line(args, lay.gpus)
    else:
        description = megatron_plan.dry_run(root, bench, system.name, overrides, corpus_dir, seed, planned=p,
                                            measured=measured).describe
    plan = job.SeedPlan(
        benchmark=benchmark, seed=seed, scheduler=system.scheduler, implementation_dir=bench.implementation_dir,
        config_file=bench.source, dgxsystem=p.variant.name, nodes=nodes, gpus_per_node=min(lay.gpus, per_node),
        walltime_minutes=walltime, seed_dir=seed_dir, env=env, job_name=job.job_name(benchmark, seed, seed_dir),
        description=description, gpus=lay.gpus, hang=bench.hang, inject_failures=bench.inject_failures,
        save_signal_s=0,  # no SIGUSR1: the fork saves on SIGTERM only; its clock ends each job
        checkpoint_interval=interval)
    return job.with_sbatch(plan, system)


def dag_plan(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """What the DAG shows and reserves for a seed: the dry run's lines."""
    return plan_seed(settings, benchmark, seed, prepared=False)


def dag_plans(settings: mlrepro_config.Settings, benchmark: str) -> dict[int, job.SeedPlan]:
    """dag_plan of every seed the benchmark lists."""
    return {seed: dag_plan(settings, benchmark, seed) for seed in settings.benchmark(benchmark).seeds}


def prepare(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """The plan, with the patched source in place and the seed's ds_config.json and line written."""
    plan = plan_seed(settings, benchmark, seed)
    ensure_source(settings, benchmark)
    env = dict(plan.env)
    line = env.pop("MEGATRON_LINE")
    plan.seed_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(env["DS_CONFIG"], json.dumps(json.loads(env.pop("DS_CONFIG_JSON")), indent=2, sort_keys=True) + "\n")
    atomic_write_text(env.get("MEGATRON_LAUNCH_FILE") or env["MEGATRON_ARGS_FILE"], line + "\n")
    log.info("%s seed %d runs: %s", benchmark, seed, line)
    return dataclasses.replace(plan, env=env)


def source_dir(root: Path, benchmark: str) -> Path:
    """Where the benchmark's patched Megatron-DeepSpeed is put (ensure_source)."""
    return Path(root) / "resources" / benchmark / "megatron-deepspeed"


def ensure_source(settings: mlrepro_config.Settings, benchmark: str) -> Path:
    """Megatron-DeepSpeed at the benchmark's pinned commit, patched, in resources/<benchmark>/megatron-deepspeed/
    (once): from config.yaml's `pretrain: megatron:` .tar.gz (device/deepspeed_carry.sh's, already patched) or
    folder where given, else fetched and patched."""
    dest = source_dir(settings.root, benchmark)
    if (dest / "pretrain_gpt.py").is_file():
        return dest
    given = settings.pretrain_overrides.get("megatron")
    if given:
        megatron_kind.install_given(Path(given), dest)
    else:
        pin = settings.benchmark(benchmark).pretrain.get("megatron")
        if pin is None:
            raise mlrepro_config.ConfigError(
                f"config/benchmarks/{benchmark}.yaml pins no Megatron-DeepSpeed (pretrain: megatron: {{url, commit}})")
        mds.fetch(settings.root, pin["url"], pin["commit"], dest)
    if not (dest / "mlrepro_patches.json").is_file():
        raise mlrepro_config.ConfigError(f"pretrain: megatron {given or dest}: not patched by mlrepro "
                                         "(no mlrepro_patches.json); use device/deepspeed_carry.sh's tarball")
    return dest


def finish_seed(bench: mlrepro_config.Benchmark, plan: job.SeedPlan, run_log: Path, out: Path) -> None:
    """The run's log kept as the seed's log, or why it is not a result (the Megatron-LM kind's rule: the log
    must reach its last iteration)."""
    megatron_kind.finish_seed(bench, plan, run_log, out)


def model_flops_per_iter(log_path: Path, model: str, gbs: int, tp: int) -> float:
    """One global batch's FLOPs as Megatron-LM counts them (megatron_score.flops_per_iteration, on the
    arguments the fork's log prints: its vocabulary, padded), so TFLOP/s and MFU compare with a Megatron-LM
    seed's logged ones; the planner's count of the model where the log lacks them."""
    counted = megatron_score.flops_per_iteration(megatron_log.parse_log(log_path), gbs, tp)
    return counted if counted is not None else cost.model_flops_per_step(workloads.gpt(model, gbs), Layout(mbs=gbs, ga=1))


def score_seed(settings: mlrepro_config.Settings, bench: mlrepro_config.Benchmark, seed: int, log_path: Path,
               plan: job.SeedPlan | None) -> dict:
    """The fork's log (and the seed's tfevents, where written) scored: convergence to the target validation
    loss, tokens/s, TFLOP/s and MFU on the Megatron-LM kind's FLOP count."""
    rules = scoring_rules.for_benchmark(bench)
    p = _planned(settings, bench)
    gpus = plan.ranks if plan else p.layout.gpus
    seed_dir = plan.seed_dir if plan else paths.SeedPaths.of(settings.root, bench.name, seed).folder
    return megatron_deepspeed_log.training_record(
        log_path, tfevents=tfevents.event_files(paths.SeedPaths(Path(seed_dir)).tensorboard),
        target_loss=rules.target_value, seed=seed, benchmark=rules.benchmark, gpus=gpus,
        gpu=settings.system.hardware.get("gpu"), seq_length=models.model(p.variant.model).seq,
        model_flops_per_iter=model_flops_per_iter(log_path, p.variant.model, p.layout.gbs, p.layout.tp)).to_json()
