rule dataset:
    input:
        container_ready,
    output:
        "resources/{benchmark}/data/manifest.json",
    resources:
        **slurm_resources(),
    log:
        "logs/{benchmark}/dataset.log",
    script:
        "../scripts/stage.py"
