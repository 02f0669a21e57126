rule base_checkpoint:
    input:
        ancient("results/{benchmark}/container.json"),
    output:
        "resources/{benchmark}/checkpoint/manifest.json",
    resources:
        **slurm_resources(),
    log:
        "logs/{benchmark}/checkpoint.log",
    script:
        "../scripts/stage.py"
