# Pretraining corpora (config/corpora/<name>.yaml, listed under `corpora:` in config.yaml or named by
# a benchmark's `corpus:`): download tasks → verified download → per chunk: extract → concatenate →
# preprocess → the blend. One job per download task and per chunk, so a cluster runs them as many
# independent array-like jobs and a rerun redoes only the missing ones. Logic: mlrepro.corpus.
from mlrepro.corpus import stages as corpus_stages


CORPUS = "resources/corpora/{corpus}"


wildcard_constraints:
    corpus="|".join(SETTINGS.corpora) or "(?!x)x",
    rank=r"\d+",
    group=r"\d+",


def corpus_download_reports(wc):
    tasks = SETTINGS.corpora[wc.corpus]["download"]["array_tasks"]
    return [f"resources/corpora/{wc.corpus}/download/task_{rank}.json" for rank in range(tasks)]


def corpus_datasets(name):
    """The .bin of every chunk and json key of corpus `name`."""
    corpus = SETTINGS.corpora[name]
    groups = range(corpus_stages.num_groups(corpus, Path(workflow.basedir)))
    return [f"resources/corpora/{name}/preprocessed/train_chunk_{g}_{key}_document.bin"
            for g in groups for key in corpus["json_keys"]]


def corpus_targets():
    # The chunks are listed too, so that a lost chunk is rebuilt (alone) by the default target.
    return [t for name in SETTINGS.corpora for t in [*corpus_datasets(name), f"resources/corpora/{name}/data_prefix.json"]]


rule corpus_download:
    output:
        f"{CORPUS}/download/task_{{rank}}.json",
    log:
        "logs/corpora/{corpus}/download_{rank}.log",
    resources:
        **slurm_resources(),
    script:
        "../scripts/corpus.py"


rule corpus_downloaded:
    input:
        corpus_download_reports,
    output:
        f"{CORPUS}/download.json",
    log:
        "logs/corpora/{corpus}/downloaded.log",
    localrule: True
    script:
        "../scripts/corpus.py"


rule corpus_extract:
    input:
        downloaded=f"{CORPUS}/download.json",
    output:
        f"{CORPUS}/extracted/group_{{group}}.json",
    log:
        "logs/corpora/{corpus}/extract_{group}.log",
    resources:
        **slurm_resources(),
    script:
        "../scripts/corpus.py"


rule corpus_concat:
    input:
        f"{CORPUS}/extracted/group_{{group}}.json",
    output:
        f"{CORPUS}/concat/train_chunk_{{group}}.jsonl",
    log:
        "logs/corpora/{corpus}/concat_{group}.log",
    resources:
        **slurm_resources(),
    script:
        "../scripts/corpus.py"


rule corpus_tokenizer:
    output:
        f"{CORPUS}/tokenizer/fetched.json",
    log:
        "logs/corpora/{corpus}/tokenizer.log",
    localrule: True
    script:
        "../scripts/corpus.py"


rule corpus_preprocess:
    input:
        jsonl=f"{CORPUS}/concat/train_chunk_{{group}}.jsonl",
        tokenizer=f"{CORPUS}/tokenizer/fetched.json",
    output:
        bin=f"{CORPUS}/preprocessed/train_chunk_{{group}}_{{key}}_document.bin",
        idx=f"{CORPUS}/preprocessed/train_chunk_{{group}}_{{key}}_document.idx",
    log:
        "logs/corpora/{corpus}/preprocess_{group}_{key}.log",
    threads: lambda wc: SETTINGS.corpora[wc.corpus]["preprocess"]["workers"]
    resources:
        # Each worker holds a few 32 MiB slices and their tokens, whatever the chunk's size.
        mem_mb=lambda wc, threads: 1024 * (threads + 1),
        **slurm_resources(),
    script:
        "../scripts/corpus.py"


rule corpus_blend:
    input:
        lambda wc: corpus_datasets(wc.corpus),
    output:
        f"{CORPUS}/data_prefix.json",
    log:
        "logs/corpora/{corpus}/blend.log",
    localrule: True
    script:
        "../scripts/corpus.py"
