# One run per seed. A finished seed is never trained again because an upstream file was touched
# or its workflow was killed: its job keeps the attempt that finished (mlrepro.launch.adopt);
# delete its folder to run it again.
rule train_seed:
    input:
        unpack(seed_data),
        container=seed_image("{benchmark}"),
        implementation=seed_implementation,
        trial=seed_trial,
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


# The opt-in trial (a GPT benchmark's `pretrain: trial:`): the planner's best layouts run a few
# iterations each as jobs through the seeds' launcher; the seeds run the measured fastest.
rule trial:
    input:
        unpack(seed_data),
        container=seed_image("{benchmark}"),
        implementation=seed_implementation,
    output:
        trials_file("{benchmark}"),
    log:
        "logs/{benchmark}/trial.log",
    message:
        "{wildcards.benchmark}: trial of the planner's best layouts, the measured fastest runs the seeds"
    localrule: True
    script:
        "../scripts/stage.py"
