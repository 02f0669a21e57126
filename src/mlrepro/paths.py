"""Where everything lives under results/ and resources/, and the readers of the records kept there.

A seed's folder, results/<benchmark>/seed_<seed>/ (private to the user), and every file in it are
named by `SeedPaths` alone (its attempts' folders by `AttemptPaths`):
  plan.json     the launch plan the seed runs, written once when it starts (mlrepro.launch.job)
  mllog.txt     the run's MLLOG lines; written last, atomically: its presence means "done"
  run.log       the output of the last attempt that ended (the rule's log), secrets redacted
  run.json      the seed's score (the score_seed stage)
  attempt_<K>/  each attempt's own folder (LOGDIR): its run.log or Slurm logs, submitit's files, and
                attempt.json (what the attempt cost: nodes, GPUs, elapsed, state; mlrepro.scoring.cost)
  job.json      the launch of the current attempt (`JobRecord`: local owner and marker, or Slurm job id)
  failure.json  why the last attempt failed; removed when an attempt succeeds
  stopped.json  the early stop did not run (or cancelled) this seed; its mllog.txt is then empty
  diverged.json its running attempt left the reference runs' band (cancelled, with early_stop.cancel_diverged)
  finished.json what mllog.txt held when the seed finished (mlrepro.launch.finished)
  segments.json, checkpoints/   a chain of time-limited segments (mlrepro.launch.chain)
  tensorboard/  the trainer's own TensorBoard event files, where it writes them (Megatron-LM's --tensorboard-dir)

Per seed, its scored curve as TensorBoard event files: results/tensorboard/<benchmark>/seed_<seed>/ (the
score_seed stage; mlrepro.scoring.tfevents), one folder under results/ for `tensorboard --logdir results/`
beside the trainers' own.

Per system: results/plan/<system>/ (calibration.json, observed.json; mlrepro.plan.calibration).
Per benchmark, a trial of the planner's candidates: results/<benchmark>/trials/ (mlrepro.kinds.plan_trial).

Per reproduction: results/<benchmark>/early_stop.json (the early stop's decision, mlrepro.scoring.early_stop)
and results/nodes/<system>/bad_nodes.json (the nodes every later seed excludes, mlrepro.slurm.node_health).

Per benchmark: results/<benchmark>/container.json (the image built), resources/<benchmark>/data and
resources/<benchmark>/checkpoint (each with its manifest.json), resources/<benchmark>/implementation.
The Snakemake rules get the same paths as wildcard patterns (`SEED_DIR_PATTERN`, through common.smk).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrepro.util.records import Record

SEED_DIR_PATTERN = "results/{benchmark}/seed_{seed}"
SCORED_TENSORBOARD_PATTERN = "results/tensorboard/{benchmark}/seed_{seed}"
_SEED_DIR_NAME = re.compile(r"^seed_(\d+)$")
_ATTEMPT_DIR_NAME = re.compile(r"^attempt_(\d+)$")

# The stages that fill resources/<benchmark>/: stage name -> folder name.
STAGE_FOLDERS = {"dataset": "data", "checkpoint": "checkpoint"}


def benchmark_dir(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/: the benchmark's seeds, score, verdict and report."""
    return Path(root) / "results" / benchmark


def benchmark_root(benchmark_folder: Path) -> Path:
    """The checkout a results/<benchmark> folder belongs to (the root every other path is under)."""
    return Path(benchmark_folder).parent.parent


def seed_dir(root: Path, benchmark: str, seed: int) -> Path:
    """results/<benchmark>/seed_<seed>/ (see the contract above)."""
    return SeedPaths.of(root, benchmark, seed).folder


@dataclass(frozen=True)
class AttemptPaths:
    """attempt_<K>/ of a seed: one attempt's own folder (its LOGDIR) and the files in it."""

    folder: Path

    RECORD = "attempt.json"
    RUN_LOG = "run.log"

    def __post_init__(self):
        object.__setattr__(self, "folder", Path(self.folder))

    @property
    def number(self) -> int:
        return int(_ATTEMPT_DIR_NAME.match(self.folder.name).group(1))

    @property
    def record(self) -> Path:
        """attempt.json: what the attempt cost (written by its backend, read by mlrepro.scoring.cost)."""
        return self.folder / self.RECORD

    @property
    def run_log(self) -> Path:
        """The local backend's log of the run (run_and_time.sh's output, redacted)."""
        return self.folder / self.RUN_LOG

    @property
    def pid_file(self) -> Path:
        """run_and_time.sh's process id (local backend)."""
        return self.folder / "run.pid"

    @property
    def submitit(self) -> Path:
        """submitit's own folder of the local job (its pickles and logs)."""
        return self.folder / ".submitit"

    @property
    def slurm_output(self) -> Path:
        """sbatch's --output pattern: run.sub's own stdout and stderr (%j: the job id)."""
        return self.folder / "slurm-%j.out"

    @property
    def adopted_log(self) -> Path:
        """The logs of a finished Slurm attempt joined, when a rerun takes that run back (mlrepro.launch.adopt)."""
        return self.folder / "adopted.log"

    def run_sub_logs(self) -> list[Path]:
        """run.sub's run log(s), ${LOGDIR}/${DATESTAMP}_1.log: a seed runs with NEXP=1."""
        return sorted(self.folder.glob("*_1.log"))

    def logs(self) -> list[Path]:
        """Everything the attempt's run writes as it goes: run.sub's logs and Slurm's output (the hang watch's)."""
        return sorted([*self.run_sub_logs(), *self.folder.glob("slurm-*.out")])

    def newest_log(self) -> Path | None:
        """The log written last in the attempt's folder (the running attempt's progress is read from it)."""
        logs = sorted((p for p in self.folder.glob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
        return logs[-1] if logs else None


@dataclass(frozen=True)
class SeedPaths:
    """results/<benchmark>/seed_<seed>/: the one owner of every file name of a seed's folder (the
    contract above), as submitit's JobPaths is of a job's; the root and the benchmark's folder come
    from the folder itself, so no caller counts parents."""

    folder: Path

    PLAN = "plan.json"
    MLLOG = "mllog.txt"
    RUN_LOG = "run.log"
    RUN_JSON = "run.json"
    JOB = "job.json"
    FAILURE = "failure.json"
    STOPPED = "stopped.json"
    DIVERGED = "diverged.json"
    FINISHED = "finished.json"
    SEGMENTS = "segments.json"
    CHECKPOINTS = "checkpoints"
    FAILURE_RESERVE = ".failure.reserve"
    MEGATRON_LAUNCH = "launch.sh"
    MEGATRON_ARGS = "megatron_args.txt"
    TENSORBOARD = "tensorboard"

    def __post_init__(self):
        object.__setattr__(self, "folder", Path(self.folder))

    @classmethod
    def of(cls, root: Path, benchmark: str, seed: int) -> SeedPaths:
        return cls.under(benchmark_dir(root, benchmark), seed)

    @classmethod
    def under(cls, benchmark_folder: Path, seed: int) -> SeedPaths:
        """The seed's folder in a results/<benchmark> folder."""
        return cls(Path(benchmark_folder) / f"seed_{seed}")

    @property
    def benchmark_dir(self) -> Path:
        return self.folder.parent

    @property
    def results_dir(self) -> Path:
        """results/: every benchmark's seeds."""
        return self.benchmark_dir.parent

    @property
    def root(self) -> Path:
        return benchmark_root(self.benchmark_dir)

    @property
    def seed(self) -> int | None:
        """The seed the folder's name says (None for a folder not named seed_<N>)."""
        m = _SEED_DIR_NAME.match(self.folder.name)
        return int(m.group(1)) if m else None

    @property
    def plan(self) -> Path:
        """The launch plan it runs (mlrepro.launch.job.SeedPlan), written when it starts."""
        return self.folder / self.PLAN

    @property
    def mllog(self) -> Path:
        return self.folder / self.MLLOG

    @property
    def run_log(self) -> Path:
        return self.folder / self.RUN_LOG

    @property
    def run_json(self) -> Path:
        return self.folder / self.RUN_JSON

    @property
    def job(self) -> Path:
        """job.json: the launch of its current attempt (`JobRecord`)."""
        return self.folder / self.JOB

    @property
    def failure(self) -> Path:
        """failure.json: why its last attempt failed."""
        return self.folder / self.FAILURE

    @property
    def failure_reserve(self) -> Path:
        """Room kept for failure.json while an attempt runs, so that a full disk can still say why it failed."""
        return self.folder / self.FAILURE_RESERVE

    @property
    def stopped(self) -> Path:
        """stopped.json: the early stop did not run, or cancelled, this seed."""
        return self.folder / self.STOPPED

    @property
    def diverged(self) -> Path:
        """diverged.json: the running attempt's evaluations left the reference runs' band."""
        return self.folder / self.DIVERGED

    @property
    def finished(self) -> Path:
        """finished.json: what its log (mllog.txt) held when the seed finished (size, sha256)."""
        return self.folder / self.FINISHED

    @property
    def segments(self) -> Path:
        """segments.json: a chained seed's segments so far (mlrepro.launch.chain)."""
        return self.folder / self.SEGMENTS

    @property
    def checkpoints(self) -> Path:
        """checkpoints/: where a checkpointing seed's trainer saves and resumes."""
        return self.folder / self.CHECKPOINTS

    @property
    def submitit(self) -> Path:
        """.submitit/ of the seed itself, where an older version kept submitit's files."""
        return self.folder / ".submitit"

    @property
    def megatron_launch(self) -> Path:
        """A local Megatron seed's torchrun line (mlrepro.kinds.megatron)."""
        return self.folder / self.MEGATRON_LAUNCH

    @property
    def megatron_args(self) -> Path:
        """A Slurm Megatron seed's per-rank pretrain_gpt.py arguments, read by run.sub (mlrepro.kinds.megatron)."""
        return self.folder / self.MEGATRON_ARGS

    @property
    def tensorboard(self) -> Path:
        """tensorboard/: the trainer's own event files (Megatron-LM's --tensorboard-dir), kept across attempts."""
        return self.folder / self.TENSORBOARD

    @property
    def scored_tensorboard(self) -> Path:
        """results/tensorboard/<benchmark>/seed_<seed>/: the seed's scored curve as event files (score_seed)."""
        return scored_tensorboard_dir(self.root, self.benchmark_dir.name, self.seed)

    def attempt(self, number: int) -> AttemptPaths:
        return AttemptPaths(self.folder / f"attempt_{number}")

    def attempts(self) -> list[AttemptPaths]:
        """The attempt folders there are, oldest first."""
        found = [AttemptPaths(p) for p in self.folder.glob("attempt_*") if _ATTEMPT_DIR_NAME.match(p.name) and p.is_dir()]
        return sorted(found, key=lambda a: a.number)

    def next_attempt(self) -> int:
        return max((a.number for a in self.attempts()), default=0) + 1


def seed_file_pattern(name: str) -> str:
    """A seed's file as a Snakemake pattern with {benchmark} and {seed} wildcards."""
    return f"{SEED_DIR_PATTERN}/{name}"


def seed_files(benchmark: str, seeds, name: str) -> list[str]:
    """The relative paths of `name` in each of the seeds' folders (Snakemake inputs)."""
    return [f"{SEED_DIR_PATTERN.format(benchmark=benchmark, seed=s)}/{name}" for s in seeds]


def scored_tensorboard_dir(root: Path, benchmark: str, seed: int) -> Path:
    """results/tensorboard/<benchmark>/seed_<seed>/: a seed's scored curve as TensorBoard event files."""
    return Path(root) / SCORED_TENSORBOARD_PATTERN.format(benchmark=benchmark, seed=seed)


def seed_dirs(benchmark_folder: Path) -> dict[int, Path]:
    """The seed folders that exist under results/<benchmark>/, by seed."""
    found = {}
    for child in (benchmark_folder.iterdir() if benchmark_folder.is_dir() else ()):
        m = _SEED_DIR_NAME.match(child.name)
        if m and child.is_dir():
            found[int(m.group(1))] = child
    return found


def stage_folder(root: Path, benchmark: str, stage: str) -> Path:
    """Where the dataset or checkpoint stage writes: resources/<benchmark>/{data,checkpoint}."""
    return resources_dir(root, benchmark) / STAGE_FOLDERS[stage]


def stage_location(root: Path, benchmark: str, stage: str) -> Path:
    """The folder runs read a stage's files from: its own, or the user's folder it recorded."""
    folder = stage_folder(root, benchmark, stage)
    return Path((read_json_if_exists(folder / "manifest.json") or {}).get("location") or folder)


def implementation_dir(root: Path, benchmark: str) -> Path:
    """resources/<benchmark>/implementation/: a git implementation fetched at its pinned commit."""
    return resources_dir(root, benchmark) / "implementation"


def corpus_dir(root: Path, corpus: str) -> Path:
    """resources/corpora/<corpus>/: everything the corpus stages make of one corpus (mlrepro.stages.corpus, mlrepro.corpus.tasks)."""
    return Path(root) / "resources" / "corpora" / corpus


def resources_dir(root: Path, benchmark: str) -> Path:
    """resources/<benchmark>/: what the benchmark's runs read (implementation, data, checkpoint, image)."""
    return Path(root) / "resources" / benchmark


def implementation_record(root: Path, benchmark: str) -> Path:
    """resources/<benchmark>/implementation.json: written once a git implementation is fetched."""
    return resources_dir(root, benchmark) / "implementation.json"


def image_sqsh(root: Path, benchmark: str) -> Path:
    """resources/<benchmark>/image.sqsh: the enroot image (pyxis clusters without a registry)."""
    return resources_dir(root, benchmark) / "image.sqsh"


def published_dir(root: Path, benchmark: str) -> Path:
    """resources/<benchmark>/published/: the published results a reference is scored from."""
    return resources_dir(root, benchmark) / "published"


# Per system: what `mlrepro preflight` and `mlrepro baseline` (and their rules) measured on it.
def preflight_dir(root: Path, system: str) -> Path:
    """results/preflight/<system>/: the system's node check (preflight.json, env_checklist.md)."""
    return Path(root) / "results" / "preflight" / system


def preflight_json(root: Path, system: str) -> Path:
    """results/preflight/<system>/preflight.json: versions, GPUs, all_reduce and matmul figures of the system."""
    return preflight_dir(root, system) / "preflight.json"


def baseline_dir(root: Path, system: str) -> Path:
    """results/baseline/<system>/: the portable GPT probe's runs on the system (baseline.json, its report)."""
    return Path(root) / "results" / "baseline" / system


def baseline_json(root: Path, system: str) -> Path:
    """results/baseline/<system>/baseline.json: the probe's TFLOP/s and MFU per model on the system."""
    return baseline_dir(root, system) / "baseline.json"


def plan_dir(root: Path, system: str) -> Path:
    """results/plan/<system>/: what the planner learned of the system (mlrepro.plan.calibration owns it)."""
    return Path(root) / "results" / "plan" / system


def calibration_json(root: Path, system: str) -> Path:
    """results/plan/<system>/calibration.json: the cost model's constants fitted on the system's measured steps."""
    return plan_dir(root, system) / "calibration.json"


def observed_json(root: Path, system: str) -> Path:
    """results/plan/<system>/observed.json: each finished seed's and trial's measured step time beside its prediction."""
    return plan_dir(root, system) / "observed.json"


def trials_dir(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/trials/: the trial of the plan's top candidates (mlrepro.kinds.plan_trial): a
    seed-like folder per candidate (its attempts count in the benchmark's cost) and trials.json."""
    return benchmark_dir(root, benchmark) / "trials"


TRIALS_JSON = "trials.json"


def trials_json(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/trials/trials.json: every candidate's predicted and measured step, and the
    choice (written by mlrepro.kinds.plan_trial; the seeds of a benchmark with `pretrain: trial:` run
    its choice, mlrepro.pretrain.megatron_plan.chosen)."""
    return trials_dir(root, benchmark) / TRIALS_JSON


def trial_dirs(benchmark_folder: Path) -> dict[str, Path]:
    """results/<benchmark>/trials/<candidate>/ folders, by candidate."""
    folder = Path(benchmark_folder) / "trials"
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_dir()} if folder.is_dir() else {}


def preflight_files(root: Path, system: str, benchmark: str) -> tuple[Path, Path]:
    """Where a preflight record of the system may be: results/preflight/<system>/ (shared), or the benchmark's."""
    return preflight_json(root, system), benchmark_dir(root, benchmark) / "preflight.json"


# The baseline's Megatron-LM runs (workload (a), mlrepro.baseline.megatron), one per precision:
# <pattern>.json (the row), <pattern>.log (Megatron's own log), <pattern>.launch.sh (its torchrun line).
MEGATRON_BASELINE_PATTERN = "results/baseline/{system}/megatron_{precision}"


def megatron_baseline_files(system: str, precisions, suffix: str = ".json") -> list[str]:
    """The relative paths of the baseline's Megatron files of `system`, one per precision."""
    return [MEGATRON_BASELINE_PATTERN.format(system=system, precision=p) + suffix for p in precisions]


def container_json(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/container.json: the image the benchmark's jobs run in."""
    return benchmark_dir(root, benchmark) / "container.json"


class RecordUnreadable(ValueError):
    """A record that is there but is not a JSON object (half-written, hand-edited)."""


def read_record(path: Path) -> dict | None:
    """The JSON object in `path`; None when the file is absent; RecordUnreadable, naming the file, otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RecordUnreadable(f"{path.name} is unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise RecordUnreadable(f"{path.name} is not a JSON object")
    return data


def read_json_if_exists(path: Path) -> dict | None:
    """The JSON object in `path`; None when the file is absent, half-written (not JSON) or holds
    something other than an object."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads(Path(path).read_text())
        return data if isinstance(data, dict) else None
    return None


def read_container(root: Path, benchmark: str) -> dict:
    """container.json of the benchmark ({} before the container stage has run)."""
    return read_json_if_exists(container_json(root, benchmark)) or {}


def container_image(record: dict, *, pushed: bool) -> str | None:
    """The image a job runs in: the .sqsh (enroot), else with `pushed` the registry copy (what
    compute nodes pull), else the local tag; None when the runtime is `none` (on the host).

    Download scripts run on this host, where the built tag exists; Slurm jobs run elsewhere.
    """
    if record.get("runtime", "none") == "none":
        return None
    pushed_ref = (record.get("push") or {}).get("ref") if pushed else None
    return (record.get("sqsh") or {}).get("path") or pushed_ref or record["tag"]


def _tuple(value) -> tuple[str, ...] | None:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else None


@dataclass(frozen=True, kw_only=True)
class JobRecord(Record):
    """job.json: the launch of a seed's current attempt, one type for both backends.

    A local attempt records who waits on it (to stop it after a crash); a Slurm one its job id, the
    sbatch line that ran and, once collected, how it ended. The keys on disk are the fields' names;
    `to_json` writes the keys of the record's situation only, as the backends always have. A key it
    does not hold is None, not ABSENT: its readers test `is None`, and the situation, not the value,
    says which keys are written.
    """

    scheduler: str | None = None  # "local" or "slurm"
    attempt: int | None = None
    logdir: Path | None = None
    submitted: str | None = None
    # a local attempt
    host: str | None = None
    controller_pid: int | None = None
    owner_pid: int | None = None
    owner_start: int | None = None
    ranks: int | None = None
    walltime_minutes: int | None = None
    # a Slurm attempt
    job_id: str | None = None
    exclude: tuple[str, ...] | None = None  # None: found in Slurm by its name, submitted unrecorded
    sbatch: tuple[str, ...] | None = None
    collected: str | None = None  # when its end was read; then state, end, elapsed_s and nodes are Slurm's
    state: str | None = None
    end: str | None = None
    elapsed_s: float | None = None
    nodes: tuple[str, ...] | None = None

    _LOCAL = ("scheduler", "host", "controller_pid", "owner_pid", "owner_start", "attempt", "logdir", "submitted",
              "ranks", "walltime_minutes")
    _SLURM = ("scheduler", "job_id", "attempt", "logdir", "exclude", "sbatch", "submitted")
    _COLLECTED = ("collected", "state", "end", "elapsed_s", "nodes")

    def _keys_to_write(self) -> list[str]:
        if self.scheduler == "local":
            return list(self._LOCAL)
        keys = [k for k in self._SLURM if k not in ("exclude", "sbatch") or getattr(self, k) is not None]
        return keys + (list(self._COLLECTED) if self.collected is not None else [])

    def _to_json_value(self, key: str, value: Any) -> Any:
        return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value

    @classmethod
    def _from_json_values(cls, known: dict[str, Any]) -> dict[str, Any]:
        """A job.json of either backend, of this version or an earlier one; missing keys read as None."""
        if known.get("logdir"):
            known["logdir"] = Path(known["logdir"])
        if known.get("job_id") is not None:
            known["job_id"] = str(known["job_id"])
        for key in ("exclude", "sbatch", "nodes"):
            if key in known:
                known[key] = _tuple(known[key])
        return known


def read_job(seed_folder: Path, *, strict: bool = False) -> JobRecord | None:
    """job.json of a seed (mlrepro.launch.job.write_job writes it); None when there is none, or with
    `strict` off when it is unreadable (with it on: RecordUnreadable, naming the file)."""
    try:
        record = read_record(SeedPaths(seed_folder).job)
    except RecordUnreadable:
        if strict:
            raise
        return None
    return JobRecord.from_json(record) if record is not None else None


def plan_file(seed_folder: Path) -> Path:
    """plan.json of a seed: the launch plan it runs (mlrepro.launch.job.SeedPlan), written when it starts."""
    return SeedPaths(seed_folder).plan


def read_plan(seed_folder: Path) -> dict | None:
    return read_json_if_exists(plan_file(seed_folder))


def attempt_record(attempt_folder: Path) -> Path:
    """attempt_<K>/attempt.json: what one attempt cost (written by its backend, read by mlrepro.scoring.cost)."""
    return AttemptPaths(Path(attempt_folder)).record


def stopped_file(seed_folder: Path) -> Path:
    """stopped.json: the early stop did not run, or cancelled, this seed."""
    return SeedPaths(seed_folder).stopped


def diverged_file(seed_folder: Path) -> Path:
    """diverged.json: the running attempt's evaluations left the reference runs' band."""
    return SeedPaths(seed_folder).diverged


def early_stop_file(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/early_stop.json: the reproduction is settled; nothing more is submitted."""
    return benchmark_dir(root, benchmark) / "early_stop.json"


def bad_nodes_file(root: Path, system: str) -> Path:
    """results/nodes/<system>/bad_nodes.json: the system's bad nodes, excluded from every later seed."""
    return Path(root) / "results" / "nodes" / system / "bad_nodes.json"


def finished_file(seed_folder: Path) -> Path:
    """finished.json of a seed: what its log (mllog.txt) held when the seed finished (size, sha256)."""
    return SeedPaths(seed_folder).finished


def read_failure(seed_folder: Path) -> dict | None:
    """failure.json of a seed: why its last attempt failed."""
    return read_json_if_exists(SeedPaths(seed_folder).failure)


def progress_file(log: Path) -> Path:
    """A long stage's progress (mlrepro.util.progress), beside its log: logs/.../<stage>.progress.json."""
    log = Path(log)
    return log.with_name(log.stem + ".progress.json")


def progress_files(root: Path, benchmark: str, corpus: str | None = None) -> list[Path]:
    """Every progress file of a benchmark's stages (dataset, checkpoint) and of its corpus's."""
    folders = [Path(root) / "logs" / benchmark] + ([Path(root) / "logs" / "corpora" / corpus] if corpus else [])
    return sorted(p for f in folders for p in f.glob("*.progress.json"))


def corpus_task_log(root: Path, corpus: str, stage: str, index: int | str) -> Path:
    """The log of one task of a corpus stage's array (index %a in an sbatch --output pattern)."""
    return Path(root) / "logs" / "corpora" / corpus / f"{stage}_task_{index}.log"
