rule report:
    input:
        score="results/{benchmark}/score.json",
        mllogs=seed_files("mllog.txt"),
    output:
        html=report("results/{benchmark}/report.html", caption="../report/report.rst", category="Report"),
        convergence=report("results/{benchmark}/plots/convergence.svg", caption="../report/convergence.rst", category="Plots"),
        time_to_train=report("results/{benchmark}/plots/time_to_train.svg", caption="../report/time_to_train.rst", category="Plots"),
    log:
        "logs/{benchmark}/report.log",
    localrule: True
    script:
        "../scripts/stage.py"


# Only benchmarks with an MLPerf ruleset have a submission package (see all_targets).
rule submission:
    input:
        score="results/{benchmark}/score.json",
        mllogs=seed_files("mllog.txt"),
    output:
        directory("results/{benchmark}/submission"),
    log:
        "logs/{benchmark}/submission.log",
    localrule: True
    script:
        "../scripts/stage.py"
