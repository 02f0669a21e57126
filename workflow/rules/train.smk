# One run per seed. A finished seed is never trained again because an upstream file was touched
# or its workflow was killed: its job keeps the attempt that finished (mlrepro.launch.adopt);
# delete its folder to run it again.
rule train_seed:
    input:
        unpack(seed_data),
        container=container_ready,
        implementation=lambda wc: [ancient(f) for f in implementation_ready(wc)],
    output:
        seed_file("mllog.txt"),
    log:
        seed_file("run.log"),
    params:
        plan=lambda wc: seed_plan(wc, "describe"),
        image=image_line,
    message:
        # the image on a line of its own: the plan line ends with the exact sbatch command
        "{wildcards.benchmark} seed {wildcards.seed}: {params.plan}\n    {wildcards.benchmark} seed {wildcards.seed} {params.image}"
    threads: lambda wc: seed_plan(wc, "local_threads")
    resources:
        runtime=lambda wc: seed_plan(wc, "walltime_minutes"),
        mem_mb=lambda wc: seed_plan(wc, "local_mem_mb"),
    localrule: True
    script:
        "../scripts/stage.py"
