# One run per seed. A finished seed is never trained again because an upstream file was touched
# or its workflow was killed: its job keeps the attempt that finished (mlrepro.launch.adopt);
# delete its folder to run it again.
rule train_seed:
    input:
        unpack(seed_data),
        container=seed_image("{benchmark}"),
        implementation=seed_implementation,
    output:
        seed_file("mllog.txt"),
    log:
        seed_file("run.log"),
    params:
        plan=seed_line,
    message:
        "{wildcards.benchmark} seed {wildcards.seed}: {params.plan}"
    threads: lambda wc: seed_plan(wc, "local_threads")
    resources:
        mem_mb=lambda wc: seed_plan(wc, "local_mem_mb"),
    localrule: True
    script:
        "../scripts/stage.py"
