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
