rule base_checkpoint:
    input:
        ancient("results/{benchmark}/container.json"),
    output:
        "resources/{benchmark}/checkpoint/manifest.json",
    log:
        "logs/{benchmark}/checkpoint.log",
    script:
        "../scripts/stage.py"
