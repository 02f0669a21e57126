"""The Megatron kind: one seed of a GPT pretraining benchmark, the planner's launch line run by mlrepro.launch.

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
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.launch import chain, job
from mlrepro.plan import calibration, hardware, models
from mlrepro.pretrain import megatron_launch, megatron_plan, megatron_source
from mlrepro.scoring import goodput as measured_goodput
from mlrepro.scoring import megatron_log, megatron_score
from mlrepro.scoring import rules as scoring_rules
from mlrepro.util.fsutil import atomic_dir, atomic_write_text, unpack_tar

log = logging.getLogger(__name__)



def plan_seed(settings: mlrepro_config.Settings, benchmark: str, seed: int, *,
              prepared: bool = True) -> job.SeedPlan:
    """The seed's plan: run_and_time.sh of the benchmark's implementation with the planner's launch line.
    prepared=False: the plan the DAG shows before the corpus stages have run (UNPREPARED stands for
    what they write), described by the dry run's lines."""
    bench, system, root = settings.benchmark(benchmark), settings.system, settings.root
    if seed not in bench.seeds:
        raise mlrepro_config.ConfigError(f"seed {seed} is not a seed of {benchmark} (seeds: {list(bench.seeds)})")
    overrides = settings.pretrain_overrides
    try:
        p = megatron_plan.shaped(megatron_plan.chosen(root, bench, system.name, overrides), overrides)
    except megatron_plan.Refused as exc:
        raise mlrepro_config.ConfigError(str(exc)) from None
    if prepared and p.variant.launcher != "megatron":  # never train something other than what the plan showed
        raise mlrepro_config.ConfigError(
            f"{benchmark}: layout {p.variant.name} is {p.variant.launcher}'s own command (`snakemake -n` and "
            f"`mlrepro plan` show it); {megatron_plan.NOT_LAUNCHED}: run it in its own container, or train "
            f"the model with `launcher: megatron`")
    corpus_dir = megatron_plan.benchmark_corpus_dir(root, bench)
    files = paths.SeedPaths.of(root, benchmark, seed)
    seed_dir = files.folder
    lay, per_node = p.layout, system.gpus_per_node
    nodes = max(1, lay.gpus // per_node)
    slurm = system.scheduler == "slurm"
    # A benchmark with `segments:` checkpoints with Megatron-LM's own --save/--load into the seed's
    # checkpoints/; under a job limit it runs as a chain of jobs, each stopped by Megatron's own clock
    # (run_and_time.sh turns JOB_SECONDS into --exit-duration-in-mins).
    limits, measured, save, interval = checkpointing(settings, benchmark, p, files)
    env = {"SEED": str(seed), "NEXP": "1", "DGXNNODES": str(nodes), "DGXNGPU": str(min(lay.gpus, per_node)),
           "MEGATRON_DIR": str(_megatron_dir(root, benchmark))}
    walltime = megatron_plan.job_minutes(p, overrides)
    if limits is not None:
        env |= chain.run_env(limits, seed_dir)
        walltime = chain.walltime_minutes(limits, walltime)
    description = ""
    if prepared:
        # Megatron's event files in the seed's folder, one for every attempt: the report's curves and
        # `mlrepro status` read them (mlrepro.scoring.tfevents), the log where there are none.
        run = megatron_plan.seed_run(p, seed, corpus_dir, system.scheduler, overrides.get("attention"),
                                     deterministic=bool(overrides.get("deterministic")),
                                     tensorboard_dir=str(files.tensorboard), **save)
        if slurm:
            env |= {"MEGATRON_ARGS_FILE": str(files.megatron_args), "DATADIR": str(corpus_dir.resolve()),
                    "CONT": str(overrides.get("image") or "${CONT}")}
            line = shlex.join(megatron_launch.pretrain_args(run))
        else:
            env["MEGATRON_LAUNCH_FILE"] = str(files.megatron_launch)
            line = megatron_launch.torchrun_line(run, nproc=lay.gpus)
        env["MEGATRON_LINE"] = line
    else:
        description = megatron_plan.dry_run(root, bench, system.name, overrides, corpus_dir, seed, planned=p,
                                            measured=measured).describe
    plan = job.SeedPlan(
        benchmark=benchmark, seed=seed, scheduler=system.scheduler, implementation_dir=bench.implementation_dir,
        config_file=bench.source, dgxsystem=p.variant.name,
        nodes=nodes, gpus_per_node=min(lay.gpus, per_node),
        walltime_minutes=walltime,
        seed_dir=seed_dir, env=env, job_name=job.job_name(benchmark, seed, seed_dir),
        description=description, gpus=lay.gpus, hang=bench.hang, inject_failures=bench.inject_failures,
        save_signal_s=limits.save_signal_seconds if limits else 0, checkpoint_interval=interval)
    return job.with_sbatch(plan, system)


def checkpointing(settings: mlrepro_config.Settings, benchmark: str, p: megatron_plan.Planned,
                  files: paths.SeedPaths) -> tuple[chain.Limits | None, dict | None, dict, dict | None]:
    """How a seed of a Megatron-family benchmark checkpoints: (its job limit, the goodput its benchmark's seeds
    measured so far, the launch line's --save/--save-interval, the plan's checkpoint interval). Nothing for a
    benchmark without `segments:`; the interval is the one set (config.yaml's, else the benchmark's) or chosen
    from the system's failures (Young/Daly) with the restart and checkpoint costs measured replacing the
    configured ones."""
    bench, system = settings.benchmark(benchmark), settings.system
    limits = chain.limits(bench.segments, system.max_job_minutes)
    measured = measured_goodput.benchmark_goodput(paths.benchmark_dir(settings.root, benchmark), system.gpus_per_node)
    if limits is None:
        return None, measured, {}, None
    f = megatron_plan.failures(p, bench, system, settings.pretrain_overrides, measured)
    save = {"save": str(files.checkpoints), "save_interval": f.interval_iterations}
    interval = {"steps": f.interval_iterations, "seconds": round(f.interval_iterations * p.step_s, 3),
                "chosen_by": f.chosen_by}
    return limits, measured, save, interval


def dag_plan(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> job.SeedPlan:
    """What the DAG shows and reserves for a seed: the dry run's lines; one core per rank here."""
    return plan_seed(settings, benchmark, seed, prepared=False)


def dag_plans(settings: mlrepro_config.Settings, benchmark: str) -> dict[int, job.SeedPlan]:
    """dag_plan of every seed the benchmark lists."""
    return {seed: dag_plan(settings, benchmark, seed) for seed in settings.benchmark(benchmark).seeds}


def prepare(settings: mlrepro_config.Settings, benchmark: str, seed: int) -> job.SeedPlan:
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


def _megatron_dir(root: Path, benchmark: str) -> Path:
    """Where the benchmark's Megatron-LM checkout is put (ensure_megatron)."""
    return Path(root) / "resources" / benchmark / "megatron"


def install_given(given: Path, dest: Path) -> None:
    """config.yaml's `pretrain: megatron:` (a .tar.gz or a folder, for a machine without network) put in
    `dest` whole or not at all."""
    with atomic_dir(dest, keep_on_error=False) as tmp:
        if given.is_file():
            unpack_tar(given, tmp)
        else:
            shutil.copytree(given, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))


def ensure_megatron(settings: mlrepro_config.Settings, benchmark: str) -> Path:
    """Megatron-LM at the benchmark's pinned commit in resources/<benchmark>/megatron/ (once): from
    the `pretrain: megatron:` folder or .tar.gz where given (no network), else fetched."""
    dest = _megatron_dir(settings.root, benchmark)
    if (dest / "pretrain_gpt.py").is_file():
        return dest
    given = settings.pretrain_overrides.get("megatron")
    if given:
        install_given(Path(given), dest)
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


def implementation_folder(bench: mlrepro_config.Benchmark, system: mlrepro_config.System) -> Path:
    """One folder for every layout: the planner, not a config_<SYS>.sh, sets the shape."""
    return Path(bench.implementation_dir)


def corpus_folder(root: Path, bench: mlrepro_config.Benchmark) -> Path:
    """The corpus whose blend and tokenizer the seeds read (mini_corpus when the benchmark names none)."""
    return megatron_plan.benchmark_corpus_dir(root, bench)


def finish_seed(bench: mlrepro_config.Benchmark, plan: job.SeedPlan, run_log: Path, out: Path) -> None:
    """Keep the run's Megatron log as the seed's log (a chained seed's: its jobs' logs as one run, see
    chained_log), or record why it is not a result."""
    parsed = megatron_log.parse_log(run_log) if run_log.exists() else None
    last = parsed.iterations[-1] if parsed and parsed.iterations else None
    if last is None or last.train_iters is None or (last.iteration < last.train_iters and not parsed.training_done):
        where = "no training iteration" if last is None else f"iteration {last.iteration} of {last.train_iters}"
        job.record_failure(plan.seed_dir, f"the run's Megatron log ends at {where}", state="INCOMPLETE_LOG")
        raise job.SeedFailed(f"seed {plan.seed}: the run's Megatron log ends at {where}; see {run_log}")
    atomic_write_text(out, chained_log(plan.seed_dir, run_log.read_text(errors="replace")))
    job.clear_failure(plan.seed_dir)


def chained_log(seed_dir: Path, last: str) -> str:
    """A chained seed's Megatron log as one run: the first job's log to its last checkpoint save, each later
    one's training lines (after its start of training) to its last save, then the finishing job's (`last`).
    The steps a killed job trained past its save were trained again by the next, and every job's restart is
    in segments.json; so the score sees each step once, one start, and every interval's time (the last job's
    own log alone held only the steps since its resume). A seed that is not chained: `last` as it is."""
    files = paths.SeedPaths(seed_dir)
    earlier = [a.run_log if a.run_log.is_file() else a.newest_log() for a in files.attempts()[:-1]]
    if not files.segments.is_file() or not earlier:
        return last
    parts = []
    for text in [p.read_text(errors="replace") for p in earlier if p is not None and p.is_file()] + [last]:
        saves = list(chain.MEGATRON_SAVED.finditer(text))
        if text is not last:
            if not saves:
                continue  # a job that saved nothing: its steps were all trained again
            end = text.find("\n", saves[-1].end())
            text = text[: end + 1] if end >= 0 else text
        if parts and (start := megatron_log.TRAINING_START.search(text)):
            text = text[text.find("\n", start.end()) + 1:]
        parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


def learn(settings: mlrepro_config.Settings, bench: mlrepro_config.Benchmark, plan: job.SeedPlan, log_path: Path) -> dict | None:
    """A finished seed's measured step time kept beside the plan's prediction for its system
    (mlrepro.plan.calibration.observe), which fits the system's constants again: the next plan starts
    from it. Returns the observation kept (None: the log has no steady state to measure)."""
    overrides = settings.pretrain_overrides
    p = megatron_plan.shaped(megatron_plan.chosen(settings.root, bench, settings.system.name, overrides), overrides)
    seq = models.model(p.variant.model).seq
    t = megatron_score.throughput(megatron_log.parse_log(log_path), gpus=p.layout.gpus, seq_length=seq,
                                  peak_tflops=None)
    if not t["iter_time_s"]:
        return None
    facts = hardware.from_system(settings.system, settings.root)
    obs = calibration.Observation(model=p.variant.model, layout=p.layout, measured_s=float(t["iter_time_s"]),
                                  source=f"seed {bench.name}/{plan.seed}", attention=overrides.get("attention") or "local")
    obs = dataclasses.replace(obs, predicted_s=round(calibration.predict(obs, facts), 4))
    calibration.observe(settings.root, settings.system.name, obs)
    return obs.to_json()


def score_seed(settings: mlrepro_config.Settings, bench: mlrepro_config.Benchmark, seed: int, log_path: Path,
               plan: job.SeedPlan | None) -> dict:
    """Megatron-LM's own log scored: MFU against the system's GPU, on the ranks the seed ran with (its
    plan.json; planned again only for a seed run before plans were kept)."""
    rules = scoring_rules.for_benchmark(bench)
    gpus = plan.ranks if plan else megatron_plan.chosen(settings.root, bench, settings.system.name,
                                                         settings.pretrain_overrides).layout.gpus
    return megatron_score.score_training_log(log_path, target_loss=rules.target_value, seed=seed,
                                             benchmark=rules.benchmark, gpus=gpus,
                                             gpu=settings.system.hardware.get("gpu"))


def unmet(root: Path, bench: mlrepro_config.Benchmark, system: mlrepro_config.System, *,
          with_implementation: bool) -> list[str]:
    """What the system lacks: a layout of the benchmark that the planner fits on it."""
    try:  # the planner, not a published config_<SYS>.sh, decides the layout
        megatron_plan.first_fit(root, bench, system.name)
    except megatron_plan.Refused as exc:
        return [str(exc).removeprefix(f"{bench.name} cannot run on system {system.name!r}: ")]
    except hardware.HardwareUnknown as exc:
        return [str(exc)]
    return []
