# Pretraining corpora (config/corpora/<name>.yaml, listed under `corpora:` in config.yaml or named by
# a benchmark's `corpus:`): download → verified download (the chunk plan) → per chunk: extract →
# concatenate → preprocess → the blend. Download and preprocess are one job each whose tasks
# (RANK/WORLD_SIZE shares; chunks) are ONE Slurm job array on a Slurm system (the job submits it
# and waits: it takes no CPU) or parallel work here; a task whose output is there is not rerun.
# Logic: mlrepro.stages.corpus (the rules), mlrepro.corpus (the corpus's work).
from mlrepro.corpus import tasks as corpus_tasks
from mlrepro.stages import corpus as corpus_stages


CORPUS = "resources/corpora/{corpus}"


wildcard_constraints:
    corpus="|".join(SETTINGS.corpora) or "(?!x)x",
    group=r"\d+",


rule corpus_download:
    output:
        f"{CORPUS}/download/tasks.json",
    log:
        "logs/corpora/{corpus}/download.log",
    params:
        plan=lambda wc: corpus_stages.plan_line(SETTINGS.corpora[wc.corpus], workflow.basedir, SYSTEM, "download"),
    message:
        "{params.plan}"
    localrule: True
    script:
        "../scripts/stage.py"


checkpoint corpus_downloaded:
    input:
        f"{CORPUS}/download/tasks.json",
    output:
        f"{CORPUS}/download.json",
    log:
        "logs/corpora/{corpus}/downloaded.log",
    localrule: True
    script:
        "../scripts/stage.py"


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
        "../scripts/stage.py"


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
        "../scripts/stage.py"


rule corpus_tokenizer:
    output:
        f"{CORPUS}/tokenizer/fetched.json",
    log:
        "logs/corpora/{corpus}/tokenizer.log",
    localrule: True
    script:
        "../scripts/stage.py"


rule corpus_preprocess:
    input:
        # With bytes_per_chunk the chunk count is known once the download is verified (a checkpoint).
        jsonl=lambda wc: corpus_tasks.preprocess_inputs(SETTINGS.corpora[wc.corpus], workflow.basedir,
                                                        lambda: checkpoints.corpus_downloaded.get(**wc).output[0]),
        tokenizer=f"{CORPUS}/tokenizer/fetched.json",
    output:
        f"{CORPUS}/preprocessed.json",
    log:
        "logs/corpora/{corpus}/preprocess.log",
    params:
        plan=lambda wc: corpus_stages.plan_line(SETTINGS.corpora[wc.corpus], workflow.basedir, SYSTEM, "preprocess"),
    message:
        "{params.plan}"
    threads: lambda wc: SETTINGS.corpora[wc.corpus]["preprocess"]["workers"]
    resources:
        # Here (no Slurm): the chunks' workers; each holds a few 16 MiB slices and their tokens.
        mem_mb=lambda wc, threads: 1024 * (threads + 1),
    localrule: True
    script:
        "../scripts/stage.py"


rule corpus_blend:
    input:
        f"{CORPUS}/preprocessed.json",
    output:
        f"{CORPUS}/data_prefix.json",
    log:
        "logs/corpora/{corpus}/blend.log",
    localrule: True
    script:
        "../scripts/stage.py"
