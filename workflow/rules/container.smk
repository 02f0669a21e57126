# A benchmark whose implementation is a git repository gets it fetched at the pinned commit
# first; it is a checkpoint because the configs it brings decide the seeds' shape.
checkpoint implementation:
    output:
        "resources/{benchmark}/implementation.json",
    log:
        "logs/{benchmark}/implementation.log",
    localrule: True
    script:
        "../scripts/stage.py"


# The image is rebuilt only when the implementation's files change (container.py compares a
# digest of the build context); downstream stages take container.json as ancient().
rule container:
    input:
        implementation_files,
    output:
        "results/{benchmark}/container.json",
    log:
        "logs/{benchmark}/container.log",
    localrule: True
    script:
        "../scripts/stage.py"
