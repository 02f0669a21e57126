def seed_data(wc):
    """What a seed reads, as ancient(): the dataset and checkpoint its benchmark configures, and
    the blend of its pretraining corpus (built by corpus.smk); a model pretrained from scratch has no checkpoint."""
    b = bench(wc.benchmark)
    files = [f"resources/{wc.benchmark}/data/manifest.json"] if b.dataset else []
    files += [f"resources/{wc.benchmark}/checkpoint/manifest.json"] if b.checkpoint else []
    files += [f"resources/corpora/{b.corpus}/data_prefix.json"] if b.corpus else []
    return [ancient(f) for f in files]


# One run per seed. Inputs are ancient(): a finished seed is never rerun because an
# upstream file was touched; delete its folder to run it again.
rule train_seed:
    input:
        container=container_ready,
        data=seed_data,
        implementation=lambda wc: [ancient(f) for f in implementation_ready(wc)],
    output:
        "results/{benchmark}/seed_{seed}/mllog.txt",
    log:
        "results/{benchmark}/seed_{seed}/run.log",
    params:
        plan=lambda wc: seed_plan(wc, "describe"),
    message:
        "{wildcards.benchmark} seed {wildcards.seed}: {params.plan}"
    threads: lambda wc: seed_plan(wc, "local_threads")
    resources:
        runtime=lambda wc: seed_plan(wc, "walltime_minutes"),
        mem_mb=lambda wc: seed_plan(wc, "local_mem_mb"),
    localrule: True
    script:
        "../scripts/stage.py"
