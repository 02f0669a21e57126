"""One seed's launch plan (config, shape, environment, sbatch line), its checks and its records; the backend chosen here.

A seed is one run of the implementation: run_and_time.sh with the environment that
config_<SYS>.sh exports plus DATADIR, MODEL, LOGDIR and SEED. On a `local` system it runs
through submitit's LocalExecutor (mlrepro.launch.local; timeout = the config's wall-time); on a
`slurm` system run.sub itself is the batch script, submitted once per seed with sbatch
(mlrepro.launch.slurm). The seed folder's files are listed in mlrepro.paths.

Before a seed starts, its dataset and checkpoint are checked against their manifests
(`verify_inputs`), and whatever an earlier attempt left running is killed (mlrepro.util.proctree).
Secrets are never part of what is handed to submitit or written: they reach the run by
inheritance from the workflow's environment.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mlrepro import paths
from mlrepro.config import (
    Benchmark,
    ConfigError,
    Settings,
    System,
)
from mlrepro.implementation import configs as implementation
from mlrepro.pretrain import segments
from mlrepro.scoring import mllog
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)


class SeedFailed(RuntimeError):
    """The seed's run failed; failure.json in its folder says why.

    `retry` is False when retrying in the same invocation would go against someone's
    decision: a job cancelled with scancel stays failed until the workflow is run again.
    """

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


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
        if requested or not _plannable(bench):
            raise ConfigError(f"{bench.name} on system {system.name}: {exc}") from None
        unfit = exc
    # No published config fits: the planner writes one for this system, which then fits exactly.
    from mlrepro.plan import generate, hardware, search

    try:
        generate.generate_config(bench, system)
    except (search.PlanError, hardware.HardwareUnknown) as why:
        raise ConfigError(f"{bench.name} on system {system.name}: {unfit}\n"
                          f"mlrepro plan could not generate one either: {why}") from None
    _pick_config.cache_clear()
    return _pick_config(bench.implementation_dir, system.nodes, system.gpus_per_node, None)


def _plannable(bench: Benchmark) -> bool:
    """An NVIDIA benchmark the planner has rules for, with published configs to start from."""
    from mlrepro.plan import workloads

    folder = Path(bench.implementation_dir)
    return (bench.mlperf_benchmark in workloads.BENCHMARKS and folder.is_dir()
            and bool(implementation.list_configs(folder)))


@dataclass(frozen=True)
class SeedPlan:
    benchmark: str
    seed: int
    scheduler: str
    implementation_dir: Path
    config_file: Path
    dgxsystem: str  # NVIDIA's DGXSYSTEM, from the config file's name (not mlrepro's config.System)
    nodes: int
    gpus_per_node: int
    walltime_minutes: int
    seed_dir: Path
    env: dict = field(repr=False)
    job_name: str = ""  # the Slurm job name (see `job_name`)
    sbatch: tuple[str, ...] = ()  # built once, here; each attempt sets its own folders on it (slurm.for_attempt)
    generated: bool = False  # the config was written by mlrepro plan, not published

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def local_threads(self) -> int:
        # A local seed occupies one core per rank; a Slurm seed only waits on the head node.
        return self.ranks if self.scheduler == "local" else 1

    @property
    def local_mem_mb(self) -> int:
        # Same reasoning: a waiting Slurm seed must not hold the head node's memory budget,
        # or Snakemake would queue only as many seeds as fit in it.
        return 1000 * self.ranks if self.scheduler == "local" else 100

    def describe(self) -> str:
        shape = f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs ({self.dgxsystem})"
        head = f"{shape}, wall-time {self.walltime_minutes} min"
        if self.generated:
            head += f" [{self.config_file.name} generated by mlrepro plan]"
        if self.scheduler == "slurm":
            return f"{head}: {shlex.join(self.sbatch)}"
        return f"{head}: local run_and_time.sh through submitit"


def plan_seed(settings: Settings, benchmark: str, seed: int) -> SeedPlan:
    bench = settings.benchmark(benchmark)
    if seed not in bench.seeds:
        raise ConfigError(f"seed {seed} is not a seed of {benchmark} (seeds: {list(bench.seeds)})")
    system = settings.system
    cfg = implementation_config(bench, system)
    root = settings.root
    seed_dir = paths.seed_dir(root, benchmark, seed)
    places = {stage: str(paths.stage_location(root, benchmark, stage)) for stage in paths.STAGE_FOLDERS}
    places["corpus"] = str(paths.corpus_dir(root, bench.corpus or "none"))
    env = {
        **cfg.env,
        **bench.env,
        **{key: value.format(**places) for key, value in bench.run_env.items()},
        "DGXSYSTEM": cfg.dgxsystem,
        "SEED": str(seed),
        "NEXP": "1",
    }
    walltime = cfg.walltime_min
    chain = segments.limits(bench.segments, system.max_job_minutes)
    if chain is not None:  # a checkpointing pretraining run: each job is one segment of the seed
        env.update(segments.run_env(chain, seed_dir))
        walltime = segments.walltime_minutes(chain, walltime)
    plan = SeedPlan(
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
        job_name=job_name(benchmark, seed, seed_dir),
        generated=_generated(cfg.path),
    )
    return with_sbatch(plan, system)


def with_sbatch(plan: SeedPlan, system: System) -> SeedPlan:
    """On a Slurm system, the plan with the sbatch line that submits the implementation's run.sub
    for it (nodes, time limit, the system's partition, account and excluded nodes)."""
    if system.scheduler != "slurm":
        return plan
    from mlrepro.slurm import client as slurm

    cmd = slurm.sbatch_command(
        plan.implementation_dir / "run.sub",
        nodes=plan.nodes,
        time_minutes=plan.walltime_minutes,
        partition=system.partition,
        account=system.account,
        exclude=system.exclude_nodes,
        job_name=plan.job_name,
    )
    return SeedPlan(**{**plan.__dict__, "sbatch": tuple(cmd)})


def _generated(config_path: Path) -> bool:
    from mlrepro.plan import generate

    return generate.is_generated(config_path)


def job_name(benchmark: str, seed: int, seed_dir: Path) -> str:
    """The seed's Slurm job name; the folder's hash keeps two checkouts' seeds apart on re-attach."""
    import hashlib

    where = hashlib.sha1(str(seed_dir.resolve()).encode()).hexdigest()[:8]
    return f"mlrepro-{benchmark}-seed{seed}-{where}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# Room kept for failure.json (a file of this size), so that a full disk can still say why a seed failed.
RESERVE_NAME = ".failure.reserve"
RESERVE_BYTES = 16384


def record_failure(seed_dir: Path, reason: str, **details) -> bool:
    """Write failure.json; False (and the reason logged) when the folder cannot take it."""
    record = {"reason": reason, "time": _now(), **details}
    for room in (None, seed_dir / RESERVE_NAME):
        if room is not None:
            # A full disk: the room kept at the attempt's start is freed for this file.
            try:
                room.unlink()
            except OSError:
                break
        try:
            atomic_write_json(seed_dir / "failure.json", record)
            return True
        except OSError as exc:
            error = exc
    log.error("%s: cannot write failure.json (%s); the seed failed: %s", seed_dir, error.strerror, reason)
    return False


def verify_inputs(plan: SeedPlan, root: Path) -> None:
    """Fail the seed, naming the file, when its dataset or checkpoint changed after its manifest was written."""
    from mlrepro.data.manifest import verify_manifest

    problems = []
    for stage in paths.STAGE_FOLDERS:
        manifest = paths.stage_folder(root, plan.benchmark, stage) / "manifest.json"
        if manifest.is_file():
            problems += verify_manifest(manifest)
    if problems:
        record_failure(plan.seed_dir, "input files changed since their manifest: " + "; ".join(problems[:5]),
                       state="INPUT_CHANGED", problems=problems)
        raise SeedFailed(f"seed {plan.seed}: the data it would use changed since it was verified:\n  "
                         + "\n  ".join(problems[:20]) + "\n(run the data stage again: delete the folder)",
                         retry=False)


def finish_seed(plan: SeedPlan, run_log: Path, mllog_out: Path, not_converged: str) -> None:
    """Turn a finished run's log into the seed's mllog.txt, or record why it is not a result."""
    parsed = mllog.parse_text(run_log.read_text(errors="replace") if run_log.exists() else "", source=str(run_log))
    stop = parsed.last("run_stop")
    if parsed.first("run_start") is None or stop is None:
        missing = "run_start" if parsed.first("run_start") is None else "run_stop"
        record_failure(plan.seed_dir, f"no {missing} in the run's MLLOG", state="INCOMPLETE_LOG")
        raise SeedFailed(f"seed {plan.seed}: the run's log has no {missing}; see {run_log}")
    status = (stop.metadata or {}).get("status")
    if status != "success" and not_converged == "rerun":
        record_failure(plan.seed_dir, f"run_stop status {status!r}", state="ABORTED")
        raise SeedFailed(f"seed {plan.seed}: run_stop status {status!r} (benchmark reruns non-converged seeds)")
    atomic_write_text(mllog_out, parsed.to_text())
    for name in ("failure.json", RESERVE_NAME):
        with contextlib.suppress(FileNotFoundError):
            (plan.seed_dir / name).unlink()


def _next_attempt(seed_dir: Path) -> int:
    numbers = [int(p.name.split("_")[1]) for p in seed_dir.glob("attempt_*") if p.name.split("_")[1].isdigit()]
    return max(numbers, default=0) + 1


def _run_env(plan: SeedPlan, logdir: Path, **extra: str) -> dict:
    """The run's settings, as given to submitit or sbatch: the plan's variables and the
    attempt's LOGDIR, nothing from this process's environment. That one reaches the run by
    inheritance (submitit's job, sbatch --export=ALL), so no secret is ever serialized."""
    return {**plan.env, "LOGDIR": str(logdir), **extra}


def _private(*folders: Path) -> None:
    """Folders that hold run parameters are the user's alone (also ones an older version made)."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.chmod(0o700)


def _io_failure(plan: SeedPlan, exc: OSError) -> None:
    """A full or read-only results folder fails the seed with its reason, not a traceback.
    Not retried in this invocation: the disk does not change by itself; a rerun recovers."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    reason = f"cannot write the seed's files: {exc.strerror or exc}{where}"
    if not record_failure(plan.seed_dir, reason, state="IO_ERROR"):
        reason += "; failure.json could not be written either"
    raise SeedFailed(f"seed {plan.seed}: {reason}", retry=False) from None


def run_seed(plan: SeedPlan, system: System, run_log: Path) -> None:
    """Run one attempt of the seed on the backend of the system's scheduler (the one place it is chosen)."""
    if plan.scheduler == "slurm":
        from mlrepro.launch.slurm import run_seed_slurm as run
    else:
        from mlrepro.launch.local import run_seed_local as run
    run(plan, system, run_log)
