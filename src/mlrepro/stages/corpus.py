"""The rules of workflow/rules/corpus.smk: a pretraining corpus downloaded, extracted, concatenated,
tokenized and blended (the corpus's own work: mlrepro.corpus.tasks). Download and preprocess are
each one job whose tasks run as ONE Slurm job array or in parallel here (mlrepro.launch.auto)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro.corpus import extract, preprocess, served, shards, tasks
from mlrepro.data import checks
from mlrepro.launch import array, auto
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)


def array_plan(corpus: dict, root: Path, stage: str, size: int) -> array.ArrayPlan:
    workers = corpus["preprocess"]["workers"] if stage == "preprocess" else 1
    # A preprocess worker holds a few slices and their tokens (bounded, see mlrepro.corpus.preprocess).
    mem = 1024 * (workers + 1) if stage == "preprocess" else None
    return array.ArrayPlan(corpus["name"], stage, size, tasks.folder(root, corpus["name"]), cpus=workers, mem_mb=mem,
                           task_module="mlrepro.corpus.tasks")


def plan_line(corpus: dict, root: Path, system, stage: str) -> str:
    """What `snakemake -n` says the stage will do: the array's sbatch line on Slurm."""
    size = corpus["download"]["array_tasks"] if stage == "download" else tasks.chunk_count(corpus, root)
    if size is None:
        return f"{corpus['name']}: {stage}, one task per chunk (the chunk count follows from the download)"
    if system.scheduler == "slurm":
        return array.describe(array_plan(corpus, root, stage, size), Path(root), system.partition, system.account)
    if stage == "preprocess":
        return (f"{corpus['name']}: preprocess, {size} chunks one after the other on this machine, "
                f"{corpus['preprocess']['workers']} workers each")
    return f"{corpus['name']}: {stage}, {size} tasks in parallel on this machine"


def run_tasks(corpus: dict, root: Path, system, stage: str, size: int, done, task, parallel: int) -> None:
    """The stage's tasks whose output is missing, as one array (see mlrepro.launch.auto.run_array)."""
    def todo() -> list[int]:
        missing = [i for i in range(size) if not done(i)]
        log.info("%s %s: %d of %d tasks to run", corpus["name"], stage, len(missing), size)
        return missing

    auto.run_array(array_plan(corpus, root, stage, size), corpus, Path(root), system, todo, done, task, parallel)


def _corpus(smk, s):
    return s.corpora[smk.wildcards.corpus]


@rule(lambda smk, s: ((_corpus(smk, s), s.root, Path(smk.output[0]), s.system), {}))
def corpus_download(corpus: dict, root: Path, out: Path, system=None) -> None:
    """Every RANK/WORLD_SIZE share (one array task each on Slurm); tasks.json gathers their reports.
    A corpus the workflow serves itself (`served:`) is served for as long as this takes."""
    world = corpus["download"]["array_tasks"]
    with served.serving(corpus, tasks.folder(root, corpus["name"])) as live:
        run_tasks(live, root, system, "download", world, lambda r: tasks.task_done(live, root, r),
                  lambda r: tasks.download_task(live, root, r), parallel=world)
    reports = [json.loads(tasks.task_report(corpus, root, r).read_text()) for r in range(world)]
    atomic_write_json(out, {"world": world, "reports": reports})


@rule(lambda smk, s: ((_corpus(smk, s), s.root, Path(smk.input[0]), Path(smk.output[0])), {}))
def corpus_downloaded(corpus: dict, root: Path, tasks_json: Path, out: Path) -> None:
    tasks.verify_download(corpus, root, tasks_json, out)


@rule(lambda smk, s: ((_corpus(smk, s), s.root, Path(smk.input.downloaded), int(smk.wildcards.group),
                       Path(smk.output[0])), {}))
def corpus_extract(corpus: dict, root: Path, downloaded: Path, group: int, out: Path) -> None:
    tasks.extract_group(corpus, root, downloaded, group, out)


@rule(lambda smk, s: ((_corpus(smk, s), Path(smk.input[0]), Path(smk.output[0])), {}))
def corpus_concat(corpus: dict, group_record: Path, out: Path) -> None:
    tasks.concat_group(corpus, group_record, out)


@rule(lambda smk, s: ((_corpus(smk, s), s.root, Path(smk.output[0])), {}))
def corpus_tokenizer(corpus: dict, root: Path, out: Path) -> None:
    with served.serving(corpus, tasks.folder(root, corpus["name"])) as live:
        tasks.fetch_tokenizer(live, root, out.parent)


@rule(lambda smk, s: ((_corpus(smk, s), s.root, sum(f.endswith(".jsonl") for f in smk.input.jsonl),
                       Path(smk.output[0]), s.system, smk.threads), {}))
def corpus_preprocess(corpus: dict, root: Path, n_groups: int, out: Path, system=None,
                      threads: int | None = None) -> None:
    """Every chunk still without its pair (one array task each on Slurm, one after the other here,
    each with all the job's threads); preprocessed.json lists the prefixes."""
    run_tasks(corpus, root, system, "preprocess", n_groups, lambda g: tasks.chunk_done(corpus, root, g),
              lambda g: tasks.preprocess_chunk(corpus, root, g, threads), parallel=1)
    atomic_write_json(out, {"prefixes": tasks.chunk_prefixes(corpus, n_groups)})


@rule(lambda smk, s: ((_corpus(smk, s), Path(smk.input[0]), Path(smk.output[0])), {}))
def corpus_blend(corpus: dict, preprocessed: Path, out: Path) -> None:
    tasks.write_blend(corpus, preprocessed, out)


def user_errors() -> tuple[type[Exception], ...]:
    return (array.ArrayError, shards.CorpusError, extract.ExtractError, preprocess.InputError, checks.DataError,
            mlrepro_config.ConfigError)
