"""What each rule of workflow/rules/corpus.smk does, as plain functions of the corpus config.

Files of corpus NAME live under resources/corpora/NAME/:

    shards/<shard name>                          downloaded (removed after extraction if asked)
    download/task_<rank>.json                    one download task's report (a Slurm array task)
    download.json                                all tasks checked against `expected`
    extracted/<name>, extracted/group_<g>.json   decompressed shards of concat chunk g
    concat/train_chunk_<g>.jsonl                 concatenated chunk g (seed 001's names)
    preprocessed/train_chunk_<g>_<key>_document.bin/.idx
    tokenizer/, tokenizer/fetched.json           the tokenizer's files, fetched
    data_prefix.json, data_prefix.txt            the blend
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from mlrepro.data import checks, http
from mlrepro.corpus import blend, concat, extract, preprocess, shards
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("vocab_file", "merge_file", "tokenizer_model")


def folder(root: Path, name: str) -> Path:
    return Path(root) / "resources" / "corpora" / name


def shard_list(corpus: dict, root: Path) -> list[shards.Shard]:
    return shards.expand(corpus["source"], root)


def num_groups(corpus: dict, root: Path) -> int:
    return len(shards.groups(len(shard_list(corpus, root)), corpus["concat"]["files_per_chunk"]))


def download_reports(corpus: dict) -> list[str]:
    """The reports of the corpus's download tasks (inputs of the verification)."""
    base = f"resources/corpora/{corpus['name']}"
    return [f"{base}/download/task_{rank}.json" for rank in range(corpus["download"]["array_tasks"])]


def datasets(corpus: dict, root: Path) -> list[str]:
    """The .bin of every chunk and json key (inputs of the blend)."""
    base = f"resources/corpora/{corpus['name']}"
    return [f"{base}/preprocessed/train_chunk_{g}_{key}_document.bin"
            for g in range(num_groups(corpus, Path(root))) for key in corpus["json_keys"]]


def targets(corpora: dict, root: Path) -> list[str]:
    """What `snakemake all` makes of each configured corpus; the chunks are listed too, so that a
    lost chunk is rebuilt, alone, by the default target."""
    return [t for c in corpora.values() for t in [*datasets(c, root), f"resources/corpora/{c['name']}/data_prefix.json"]]


def _manifest(corpus: dict, root: Path) -> dict | None:
    path = corpus.get("expected", {}).get("manifest")
    if not path:
        return None
    path = Path(path) if Path(path).is_absolute() else Path(root) / path
    return json.loads(path.read_text())


def download_task(corpus: dict, root: Path, rank: int, report: Path) -> None:
    base = folder(root, corpus["name"])
    dl = corpus["download"]
    extracted = base / "extracted"
    shards.download_share(
        shard_list(corpus, root), rank, dl["array_tasks"], base / "shards", report,
        workers=dl["workers"], retries=dl["retries"], token_env=corpus["source"].get("token_env"),
        manifest=_manifest(corpus, root),
        # A shard extracted and removed (delete_compressed) is not downloaded again.
        already=lambda s: (extracted / extract.extracted_name(s.name)).exists() and not (base / "shards" / s.name).exists(),
    )


def verify_download(corpus: dict, root: Path, reports: list[Path], out: Path) -> None:
    shards.verify(shard_list(corpus, root), [json.loads(Path(r).read_text()) for r in reports], out,
                  expected_files=corpus.get("expected", {}).get("files"),
                  min_files=corpus.get("expected", {}).get("min_files"))


def _group_shards(corpus: dict, root: Path, downloaded: Path, g: int) -> list[dict]:
    record = json.loads(Path(downloaded).read_text())
    positions = shards.groups(len(record["shards"]), corpus["concat"]["files_per_chunk"])[g]
    return [record["shards"][p] for p in positions if record["shards"][p]["size"] is not None]


def extract_group(corpus: dict, root: Path, downloaded: Path, g: int, out: Path) -> None:
    base = folder(root, corpus["name"])
    members = _group_shards(corpus, root, downloaded, g)
    srcs = [base / "shards" / m["name"] for m in members]
    ex = corpus["extract"]
    outputs = extract.extract_all(srcs, base / "extracted", workers=ex["workers"], delete_compressed=ex["delete_compressed"])
    atomic_write_json(out, {"group": g, "files": [{"name": p.name, "path": str(p), "size": p.stat().st_size}
                                                  for p in outputs]})


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


def preprocess_chunk(corpus: dict, root: Path, jsonl: Path, key: str, out_bin: Path, threads: int | None = None) -> None:
    prefix = str(out_bin).removesuffix(f"_{key}_document.bin")
    options = preprocess.Options(
        input=Path(jsonl), output_prefix=prefix, tokenizer_type=corpus["tokenizer"]["type"],
        json_keys=(key,), append_eod=corpus["append_eod"],
        workers=threads or corpus["preprocess"]["workers"], **tokenizer_paths(corpus, root))
    result = preprocess.preprocess(options)
    log.info("%s: %d documents, %s tokens, %.1f s (%s)", jsonl, result.documents, result.tokens, result.seconds,
             result.backend)


def write_blend(corpus: dict, bins: list[Path], out: Path) -> None:
    prefixes = [str(Path(b).with_suffix("")) for b in bins]
    record = blend.write_blend(prefixes, out, corpus["blend"]["weights"])
    log.info("blend of %d datasets, %d tokens", len(prefixes), record["total_tokens"])


def run_from_snakemake(smk) -> None:
    from mlrepro import config as mlrepro_config
    from mlrepro.stages import stage_process

    root = Path.cwd()
    settings = mlrepro_config.load(smk.config, root)
    wc = smk.wildcards
    corpus = settings.corpora[wc.corpus]
    out = Path(smk.output[0])
    calls = {
        "corpus_download": lambda: download_task(corpus, root, int(wc.rank), out),
        "corpus_downloaded": lambda: verify_download(corpus, root, list(map(Path, smk.input)), out),
        "corpus_extract": lambda: extract_group(corpus, root, Path(smk.input.downloaded), int(wc.group), out),
        "corpus_concat": lambda: concat_group(corpus, Path(smk.input[0]), out),
        "corpus_tokenizer": lambda: fetch_tokenizer(corpus, root, out.parent),
        "corpus_preprocess": lambda: preprocess_chunk(corpus, root, Path(smk.input.jsonl), wc.key, out, smk.threads),
        "corpus_blend": lambda: write_blend(corpus, list(map(Path, smk.input)), out),
    }
    errors = (shards.CorpusError, extract.ExtractError, preprocess.InputError, checks.DataError, mlrepro_config.ConfigError)
    with stage_process(Path(smk.log[0])):
        try:
            calls[smk.rule]()
        except errors as exc:
            logging.getLogger("mlrepro").error("%s", exc)
            raise SystemExit(1) from None


