rule score_seed:
    input:
        "results/{benchmark}/seed_{seed}/mllog.txt",
    output:
        "results/{benchmark}/seed_{seed}/run.json",
    log:
        "logs/{benchmark}/score_seed_{seed}.log",
    localrule: True
    script:
        "../scripts/stage.py"


rule score:
    input:
        runs=seed_files("run.json"),
        mllogs=seed_files("mllog.txt"),
    output:
        report("results/{benchmark}/score.json", caption="../report/score.rst", category="Score"),
    log:
        "logs/{benchmark}/score.log",
    localrule: True
    script:
        "../scripts/stage.py"
