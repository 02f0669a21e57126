rule dataset:
    input:
        ancient("results/{benchmark}/container.json"),
    output:
        "resources/{benchmark}/data/manifest.json",
    log:
        "logs/{benchmark}/dataset.log",
    script:
        "../scripts/stage.py"
