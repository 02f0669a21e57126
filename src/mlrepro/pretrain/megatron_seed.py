"""One seed of a GPT pretraining benchmark as a launch plan: the planner's launch line, run by the launch backends.

The seed is the same kind of job as an MLPerf seed (mlrepro.launch: attempt folders, job.json,
failure.json, retries): run_and_time.sh of implementations/megatron_gpt under submitit on a
`local` system, run.sub under sbatch on a `slurm` one. What differs is what it runs: on one
machine the planner's torchrun line (written to the seed's launch.sh, which run_and_time.sh
executes in the Megatron-LM checkout), on Slurm the per-rank pretrain_gpt.py arguments that
run.sub's srun hands to run_and_time.sh. The data is the corpus stages' blend and tokenizer;
the log kept as the seed's log is Megatron-LM's own (scored by mlrepro.scoring.megatron_score).

The workflow's `pretrain:` settings (config.yaml or --config) shorten a run for a measurement:
train_iters, gbs, mbs, attention (local | sdpa), megatron (a Megatron-LM folder or .tar.gz
for a machine without network; otherwise the benchmark's pinned commit is fetched).
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import shutil
import tarfile
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.launch import plan as launch
from mlrepro.pretrain import megatron_launch, megatron_plan, megatron_source
from mlrepro.scoring import megatron_log
from mlrepro.util.fsutil import atomic_dir, atomic_write_text

log = logging.getLogger(__name__)

LAUNCH_FILE = "launch.sh"  # the local launch line (torchrun ...), in the seed folder
ARGS_FILE = "megatron_args.txt"  # the per-rank pretrain_gpt.py arguments (run.sub), in the seed folder


def plan_seed(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> launch.SeedPlan:
    """The seed's launch.SeedPlan: run_and_time.sh of the benchmark's implementation with the planner's launch."""
    bench, system, root = settings.benchmark(benchmark), settings.system, settings.root
    if seed not in bench.seeds:
        raise mlrepro_config.ConfigError(f"seed {seed} is not a seed of {benchmark} (seeds: {list(bench.seeds)})")
    overrides = settings.pretrain_overrides
    p = megatron_plan.shaped(megatron_plan.first_fit(root, bench, system.name), overrides)
    if p.variant.launcher != "megatron":  # never train something other than what the plan showed
        raise mlrepro_config.ConfigError(
            f"{benchmark}: layout {p.variant.name} is {p.variant.launcher}'s own command (`snakemake -n` and "
            f"`mlrepro plan` show it); {megatron_plan.NOT_LAUNCHED}: run it in its own container, or train "
            f"the model with `launcher: megatron`")
    corpus_dir = megatron_plan.benchmark_corpus_dir(root, bench)
    seed_dir = paths.seed_dir(root, benchmark, seed)
    lay, per_node = p.layout, system.gpus_per_node
    nodes = max(1, lay.gpus // per_node)
    slurm = system.scheduler == "slurm"
    run = megatron_plan.seed_run(p, seed, corpus_dir, system.scheduler, overrides.get("attention"))
    env = {"SEED": str(seed), "NEXP": "1", "DGXNNODES": str(nodes), "DGXNGPU": str(min(lay.gpus, per_node)),
           "MEGATRON_DIR": str(megatron_dir(root, benchmark))}
    if slurm:
        env |= {"MEGATRON_ARGS_FILE": str(seed_dir / ARGS_FILE), "DATADIR": str(corpus_dir.resolve()),
                "CONT": str(overrides.get("image") or "${CONT}")}
        line = shlex.join(megatron_launch.pretrain_args(run))
    else:
        env["MEGATRON_LAUNCH_FILE"] = str(seed_dir / LAUNCH_FILE)
        line = megatron_launch.torchrun_line(run, nproc=lay.gpus)
    plan = launch.SeedPlan(
        benchmark=benchmark, seed=seed, scheduler=system.scheduler, implementation_dir=bench.implementation_dir,
        config_file=bench.source, dgxsystem=p.variant.name,
        nodes=nodes, gpus_per_node=min(lay.gpus, per_node),
        walltime_minutes=megatron_plan.job_minutes(p, overrides),
        seed_dir=seed_dir, env={**env, "MEGATRON_LINE": line},
        job_name=launch.job_name(benchmark, seed, seed_dir))
    return launch.with_sbatch(plan, system)


def prepare(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> launch.SeedPlan:
    """The seed's plan, with Megatron-LM in place and the launch line written into the seed folder."""
    plan = plan_seed(settings, benchmark, seed)
    ensure_megatron(settings, benchmark)
    env = dict(plan.env)
    line = env.pop("MEGATRON_LINE")
    target = env.get("MEGATRON_LAUNCH_FILE") or env["MEGATRON_ARGS_FILE"]
    plan.seed_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, line + "\n")
    log.info("%s seed %d runs: %s", benchmark, seed, line)
    return dataclasses.replace(plan, env=env)


def megatron_dir(root: Path, benchmark: str) -> Path:
    return Path(root) / "resources" / benchmark / "megatron"


def ensure_megatron(settings: mlrepro_config.Settings, benchmark: str) -> Path:
    """Megatron-LM at the benchmark's pinned commit in resources/<benchmark>/megatron/ (once): from
    the `pretrain: megatron:` folder or .tar.gz where given (no network), else fetched."""
    dest = megatron_dir(settings.root, benchmark)
    if (dest / "pretrain_gpt.py").is_file():
        return dest
    given = settings.pretrain_overrides.get("megatron")
    if given and Path(given).is_file():
        with atomic_dir(dest, keep_on_error=False) as tmp, tarfile.open(given) as tar:
            tar.extractall(tmp, filter="data")
    elif given:
        with atomic_dir(dest, keep_on_error=False) as tmp:
            shutil.copytree(given, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    else:
        pin = settings.benchmark(benchmark).pretrain.get("megatron")
        if pin is None:
            raise mlrepro_config.ConfigError(
                f"config/benchmarks/{benchmark}.yaml pins no Megatron-LM (pretrain: megatron: {{url, commit}}) "
                "and config.yaml's pretrain: megatron: names no folder or .tar.gz")
        megatron_source.fetch(pin["url"], pin["commit"], dest)
    if not (dest / "pretrain_gpt.py").is_file():
        raise mlrepro_config.ConfigError(f"pretrain: megatron {given or dest} holds no pretrain_gpt.py")
    return dest


def finish_seed(plan: launch.SeedPlan, run_log: Path, out: Path) -> None:
    """Keep the run's Megatron-LM log as the seed's log, or record why it is not a result."""
    parsed = megatron_log.parse_log(run_log) if run_log.exists() else None
    last = parsed.iterations[-1] if parsed and parsed.iterations else None
    if last is None or last.train_iters is None or last.iteration < last.train_iters:
        where = "no training iteration" if last is None else f"iteration {last.iteration} of {last.train_iters}"
        launch.record_failure(plan.seed_dir, f"the run's Megatron log ends at {where}", state="INCOMPLETE_LOG")
        raise launch.SeedFailed(f"seed {plan.seed}: the run's Megatron log ends at {where}; see {run_log}")
    atomic_write_text(out, run_log.read_text(errors="replace"))
    for name in ("failure.json", launch.RESERVE_NAME):
        (plan.seed_dir / name).unlink(missing_ok=True)
