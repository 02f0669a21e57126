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
# digest of the build context); downstream stages take container.json as ancient(). It is a
# checkpoint so that the DAG is evaluated again once it has run: Snakemake never looks at a job
# whose only path from a job that must run goes through ancient() inputs (snakemake#4166), so
# without it a rebuilt container hid the seeds that were missing and the run ended "done".
checkpoint container:
    input:
        implementation_files,
    output:
        "results/{benchmark}/container.json",
    log:
        "logs/{benchmark}/container.log",
    params:
        image=image_line,
    message:
        "{wildcards.benchmark} container: {params.image}"
    localrule: True
    script:
        "../scripts/stage.py"
