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
        lambda wc: corpus_stages.download_reports(SETTINGS.corpora[wc.corpus]),
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
        lambda wc: corpus_stages.datasets(SETTINGS.corpora[wc.corpus], workflow.basedir),
    output:
        f"{CORPUS}/data_prefix.json",
    log:
        "logs/corpora/{corpus}/blend.log",
    localrule: True
    script:
        "../scripts/corpus.py"
