"""A pretraining corpus's work, as plain functions of its config: shares, chunks and their tasks.

The rules of workflow/rules/corpus.smk (mlrepro.stages.corpus) call these; one job-array task
runs `python -m mlrepro.corpus.tasks download|preprocess --spec F --root R --index I`.

Files of corpus NAME live under resources/corpora/NAME/:

    shards/<shard name>                          downloaded (removed after extraction if asked)
    download/task_<rank>.json                    one download task's report (a Slurm array task)
    download/tasks.json                          every task's report (the download stage's output)
    download.json                                all tasks checked against `expected`; the chunk plan
    extracted/<name>, extracted/group_<g>.json   decompressed shards of concat chunk g
    concat/train_chunk_<g>.jsonl                 concatenated chunk g (the NeMo guide's names)
    preprocessed/train_chunk_<g>_<key>_document.bin/.idx   one pair per chunk (a Slurm array task)
    preprocessed.json                            every chunk's prefix (the preprocess stage's output)
    tokenizer/, tokenizer/fetched.json           the tokenizer's files, fetched
    slurm/                                       the array batch scripts (Slurm systems)
    data_prefix.json, data_prefix.txt            the blend

Download and preprocess are each ONE Snakemake job per corpus whose tasks (RANK/WORLD_SIZE
shares; chunks) run as one Slurm job array or, without Slurm, in parallel here (see
mlrepro.launch.array); a task whose output is there is not run again.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from mlrepro import paths
from mlrepro.corpus import blend, concat, extract, preprocess, shards
from mlrepro.data import checks, http
from mlrepro.util import progress
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("vocab_file", "merge_file", "tokenizer_model")


def folder(root: Path, name: str) -> Path:
    return paths.corpus_dir(root, name)


def shard_list(corpus: dict, root: Path) -> list[shards.Shard]:
    return shards.expand(corpus["source"], root)


def num_groups(corpus: dict, root: Path) -> int | None:
    """Concatenated chunks of the corpus, known before the download with files_per_chunk; None with
    bytes_per_chunk (the chunk plan needs the shards' sizes: see download.json)."""
    per = corpus["concat"].get("files_per_chunk")
    return len(shards.groups(len(shard_list(corpus, root)), per)) if per else None


def chunk_plan(corpus: dict, sizes: list[int | None]) -> list[range]:
    """Shard positions of each chunk: by count, or by bytes (sizes as downloaded, holes None)."""
    per = corpus["concat"].get("files_per_chunk")
    if per:
        return shards.groups(len(sizes), per)
    return shards.groups_by_bytes(sizes, corpus["concat"]["bytes_per_chunk"])


def chunk_count(corpus: dict, root: Path, downloaded=None) -> int | None:
    """The chunk count: from the config (files_per_chunk), else from download.json, whose path
    `downloaded()` gives (in the workflow: the checkpoint's output, once it has run)."""
    n = num_groups(corpus, root)
    if n is not None or downloaded is None:
        return n
    return len(json.loads(Path(downloaded()).read_text())["chunks"])


def base(corpus: dict) -> str:
    return f"resources/corpora/{corpus['name']}"


def chunk_prefixes(corpus: dict, n_groups: int) -> list[str]:
    return [f"{base(corpus)}/preprocessed/train_chunk_{g}_{key}_document"
            for g in range(n_groups) for key in corpus["json_keys"]]


def preprocess_inputs(corpus: dict, root: Path, downloaded=None) -> list[str]:
    """The concatenated chunks; and, when a chunk's .bin/.idx went missing after the stage ran, the
    folder it was deleted from (newer than preprocessed.json, so the stage reruns, for that chunk alone)."""
    n_groups = chunk_count(corpus, root, downloaded)
    inputs = [f"{base(corpus)}/concat/train_chunk_{g}.jsonl" for g in range(n_groups)]
    if (Path(root) / f"{base(corpus)}/preprocessed.json").exists() and not all(
            (Path(root) / f"{p}{s}").exists() for p in chunk_prefixes(corpus, n_groups) for s in (".bin", ".idx")):
        inputs.append(f"{base(corpus)}/preprocessed")
    return inputs


def targets(corpora: dict, root: Path) -> list[str]:
    """What `snakemake all` makes of each configured corpus."""
    return [f"{base(c)}/{name}" for c in corpora.values() for name in ("preprocessed.json", "data_prefix.json")]


def _manifest(corpus: dict, root: Path) -> dict | None:
    path = corpus.get("expected", {}).get("manifest")
    if not path:
        return None
    path = Path(path) if Path(path).is_absolute() else Path(root) / path
    return json.loads(path.read_text())


def download_task(corpus: dict, root: Path, rank: int, report: Path | None = None) -> None:
    base = folder(root, corpus["name"])
    dl = corpus["download"]
    extracted = base / "extracted"
    # One file per task: the tasks of a Slurm array run apart; `mlrepro status` adds them up.
    watched = paths.progress_file(paths.corpus_task_log(root, corpus["name"], "download", rank))
    with progress.Meter(f"{corpus['name']} download, task {rank}", watched) as meter:
        shards.download_share(
            shard_list(corpus, root), rank, dl["array_tasks"], base / "shards", report or task_report(corpus, root, rank),
            workers=dl["workers"], retries=dl["retries"], token_env=corpus["source"].get("token_env"),
            manifest=_manifest(corpus, root), hub=corpus["source"].get("hub"), meter=meter,
            # A shard extracted and removed (delete_compressed) is not downloaded again.
            already=lambda s: (extracted / extract.extracted_name(s.name)).exists() and not (base / "shards" / s.name).exists(),
        )


def task_report(corpus: dict, root: Path, rank: int) -> Path:
    return folder(root, corpus["name"]) / "download" / f"task_{rank}.json"


def task_done(corpus: dict, root: Path, rank: int) -> bool:
    """A report of this rank under the same WORLD_SIZE (another split gives other shares)."""
    try:
        return json.loads(task_report(corpus, root, rank).read_text())["world"] == corpus["download"]["array_tasks"]
    except (OSError, ValueError, KeyError):
        return False


def chunk_done(corpus: dict, root: Path, g: int) -> bool:
    """Chunk g's pairs are there and newer than the chunk (a chunk concatenated again is tokenized again)."""
    jsonl = Path(root) / f"{base(corpus)}/concat/train_chunk_{g}.jsonl"
    made = jsonl.stat().st_mtime if jsonl.exists() else 0
    outputs = [Path(root) / f"{base(corpus)}/preprocessed/train_chunk_{g}_{key}_document{s}"
               for key in corpus["json_keys"] for s in (".bin", ".idx")]
    return all(p.exists() and p.stat().st_mtime >= made for p in outputs)


def verify_download(corpus: dict, root: Path, tasks: Path, out: Path) -> None:
    reports = json.loads(Path(tasks).read_text())["reports"]
    record = shards.verify(shard_list(corpus, root), reports, out,
                           expected_files=corpus.get("expected", {}).get("files"),
                           min_files=corpus.get("expected", {}).get("min_files"))
    chunks = chunk_plan(corpus, [s["size"] for s in record["shards"]])
    atomic_write_json(out, {**record, "chunks": [[r.start, r.stop] for r in chunks]})
    log.info("chunk plan: %d chunks", len(chunks))


def _group_shards(corpus: dict, root: Path, downloaded: Path, g: int) -> list[dict]:
    record = json.loads(Path(downloaded).read_text())
    first, stop = record["chunks"][g]
    return [record["shards"][p] for p in range(first, stop) if record["shards"][p]["size"] is not None]


def extract_group(corpus: dict, root: Path, downloaded: Path, g: int, out: Path) -> None:
    base = folder(root, corpus["name"])
    members = _group_shards(corpus, root, downloaded, g)
    srcs = [base / "shards" / m["name"] for m in members]
    ex = corpus["extract"]
    outputs = extract.extract_all(srcs, base / "extracted", workers=ex["workers"], delete_compressed=ex["delete_compressed"],
                                  refetch=lambda src, error: refetch_shard(corpus, root, src, error))
    atomic_write_json(out, {"group": g, "files": [{"name": p.name, "path": str(p), "size": p.stat().st_size}
                                                  for p in outputs]})


def refetch_shard(corpus: dict, root: Path, src: Path, error: Exception) -> bool:
    """Download again a shard that does not decompress (a transfer the server ended early gives a
    complete-looking file); False for a shard of a local folder, which is the user's to mend."""
    shard = next((s for s in shard_list(corpus, root) if s.name == src.name), None)
    if shard is None or shard.is_local:
        return False
    log.warning("%s; downloading %s again", error, shard.name)
    src.unlink(missing_ok=True)
    dl, source = corpus["download"], corpus["source"]
    token_env, hub = source.get("token_env"), source.get("hub")
    if hub:
        shards.fetch_hub_shards(hub, [shard], src.parent, workers=1, token_env=token_env or "HF_TOKEN",
                                token_required=bool(token_env))
    token = checks.require_token(token_env, purpose="download the corpus") if token_env and not hub else None
    size = shards.fetch_shard(shard, src, retries=dl["retries"], token=token,
                              expected=(_manifest(corpus, root) or {}).get(shard.name))
    if size is None:
        raise extract.ExtractError(f"{error}; downloading it again failed: the source no longer has {shard.source}")
    return True


def concat_group(corpus: dict, group_record: Path, out: Path) -> None:
    files = [Path(f["path"]) for f in json.loads(Path(group_record).read_text())["files"]]
    size = concat.concatenate(files, out)
    log.info("%s: %d files, %d bytes", out, len(files), size)


def fetch_tokenizer(corpus: dict, root: Path, out_dir: Path) -> dict:
    """The tokenizer's files into resources/corpora/NAME/tokenizer/ (URLs downloaded, paths copied)."""
    tok = corpus["tokenizer"]
    out_dir.mkdir(parents=True, exist_ok=True)
    fetched = {"type": tok["type"]}
    for key in TOKENIZER_FILES:
        source = tok.get(key)
        if not source:
            continue
        dest = out_dir / Path(source.rstrip("/")).name
        if "://" in source:
            http.http_download(source, dest)
        else:
            src = Path(source) if Path(source).is_absolute() else Path(root) / source
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, dest)
        fetched[key] = str(dest)
    atomic_write_json(out_dir / "fetched.json", fetched)
    return fetched


def tokenizer_paths(corpus: dict, root: Path) -> dict:
    """{vocab_file: path, ...} of the fetched tokenizer files."""
    out_dir = folder(root, corpus["name"]) / "tokenizer"
    return {key: str(out_dir / Path(corpus["tokenizer"][key].rstrip("/")).name)
            for key in TOKENIZER_FILES if corpus["tokenizer"].get(key)}


def preprocess_chunk(corpus: dict, root: Path, g: int, threads: int | None = None) -> None:
    """Chunk g's .bin/.idx pair for every json key (one array task on Slurm)."""
    base = folder(root, corpus["name"])
    jsonl = base / "concat" / f"train_chunk_{g}.jsonl"
    for key in corpus["json_keys"]:
        options = preprocess.Options(
            input=jsonl, output_prefix=str(base / "preprocessed" / f"train_chunk_{g}"),
            tokenizer_type=corpus["tokenizer"]["type"], json_keys=(key,), append_eod=corpus["append_eod"],
            workers=threads or corpus["preprocess"]["workers"], **tokenizer_paths(corpus, root))
        result = preprocess.preprocess(options)
        log.info("%s: %d documents, %s tokens, %.1f s (%s)", jsonl, result.documents, result.tokens, result.seconds,
                 result.backend)


def array_task(corpus: dict, root: Path, stage: str, index: int) -> None:
    """One Slurm array task (this module's entry point, below): a download share or a chunk."""
    if stage == "download":
        download_task(corpus, root, index)
    else:
        preprocess_chunk(corpus, root, index)


def write_blend(corpus: dict, preprocessed: Path, out: Path) -> None:
    prefixes = json.loads(Path(preprocessed).read_text())["prefixes"]
    record = blend.write_blend(prefixes, out, corpus["blend"]["weights"])
    log.info("blend of %d datasets, %d tokens", len(prefixes), record["total_tokens"])


def main(argv: list[str] | None = None) -> int:
    """One array task: `python -m mlrepro.corpus.tasks download|preprocess --spec F --root R --index I`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mlrepro.corpus.tasks")
    parser.add_argument("stage", choices=["download", "preprocess"])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    corpus = json.loads(Path(args.spec).read_text())
    try:
        array_task(corpus, Path(args.root), args.stage, args.index)
    except Exception as exc:
        log.error("%s task %d: %s", args.stage, args.index, exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
