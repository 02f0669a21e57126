# The base checkpoint a benchmark fine-tunes (its `checkpoint:` sources). Logic: mlrepro.stages.model.
rule base_checkpoint:
    input:
        container_ready,
    output:
        "resources/{benchmark}/checkpoint/manifest.json",
    resources:
        **slurm_resources(),
    log:
        "logs/{benchmark}/checkpoint.log",
    script:
        "../scripts/stage.py"
