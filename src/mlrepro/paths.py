"""Where everything lives under results/ and resources/, and the readers of the records kept there.

Seed folder contract (results/<benchmark>/seed_<seed>/, private to the user):
  plan.json     the launch plan the seed runs, written once when it starts (mlrepro.launch.job)
  mllog.txt     the run's MLLOG lines; written last, atomically: its presence means "done"
  run.log       the output of the last attempt that ended (the rule's log), secrets redacted
  run.json      the seed's score (the score_seed stage)
  attempt_<K>/  each attempt's own folder (LOGDIR): its run.log or Slurm logs, submitit's files, and
                attempt.json (what the attempt cost: nodes, GPUs, elapsed, state; mlrepro.scoring.cost)
  job.json      the launch of the current attempt (local owner and marker, or Slurm job id)
  failure.json  why the last attempt failed; removed when an attempt succeeds
  stopped.json  the early stop did not run (or cancelled) this seed; its mllog.txt is then empty
  diverged.json its running attempt left the reference runs' band (cancelled, with early_stop.cancel_diverged)

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
from pathlib import Path

SEED_DIR_PATTERN = "results/{benchmark}/seed_{seed}"
_SEED_DIR_NAME = re.compile(r"^seed_(\d+)$")

# The stages that fill resources/<benchmark>/: stage name -> folder name.
STAGE_FOLDERS = {"dataset": "data", "checkpoint": "checkpoint"}


def benchmark_dir(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/: the benchmark's seeds, score, verdict and report."""
    return Path(root) / "results" / benchmark


def seed_dir(root: Path, benchmark: str, seed: int) -> Path:
    """results/<benchmark>/seed_<seed>/ (see the contract above)."""
    return benchmark_dir(root, benchmark) / f"seed_{seed}"


def seed_file_pattern(name: str) -> str:
    """A seed's file as a Snakemake pattern with {benchmark} and {seed} wildcards."""
    return f"{SEED_DIR_PATTERN}/{name}"


def seed_files(benchmark: str, seeds, name: str) -> list[str]:
    """The relative paths of `name` in each of the seeds' folders (Snakemake inputs)."""
    return [f"{SEED_DIR_PATTERN.format(benchmark=benchmark, seed=s)}/{name}" for s in seeds]


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


def read_job(seed_folder: Path) -> dict | None:
    """job.json of a seed: the launch of its current attempt."""
    return read_json_if_exists(seed_folder / "job.json")


def plan_file(seed_folder: Path) -> Path:
    """plan.json of a seed: the launch plan it runs (mlrepro.launch.job.SeedPlan), written when it starts."""
    return seed_folder / "plan.json"


def read_plan(seed_folder: Path) -> dict | None:
    return read_json_if_exists(plan_file(seed_folder))


def attempt_record(attempt_folder: Path) -> Path:
    """attempt_<K>/attempt.json: what one attempt cost (written by its backend, read by mlrepro.scoring.cost)."""
    return attempt_folder / "attempt.json"


def stopped_file(seed_folder: Path) -> Path:
    """stopped.json: the early stop did not run, or cancelled, this seed."""
    return seed_folder / "stopped.json"


def diverged_file(seed_folder: Path) -> Path:
    """diverged.json: the running attempt's evaluations left the reference runs' band."""
    return seed_folder / "diverged.json"


def early_stop_file(root: Path, benchmark: str) -> Path:
    """results/<benchmark>/early_stop.json: the reproduction is settled; nothing more is submitted."""
    return benchmark_dir(root, benchmark) / "early_stop.json"


def bad_nodes_file(root: Path, system: str) -> Path:
    """results/nodes/<system>/bad_nodes.json: the system's bad nodes, excluded from every later seed."""
    return Path(root) / "results" / "nodes" / system / "bad_nodes.json"


def finished_file(seed_folder: Path) -> Path:
    """finished.json of a seed: what its log (mllog.txt) held when the seed finished (size, sha256)."""
    return seed_folder / "finished.json"


def read_failure(seed_folder: Path) -> dict | None:
    """failure.json of a seed: why its last attempt failed."""
    return read_json_if_exists(seed_folder / "failure.json")


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
