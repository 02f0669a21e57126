rule report:
    input:
        score="results/{benchmark}/score.json",
        mllogs=seed_files("mllog.txt"),
        verdict="results/{benchmark}/verdict.json",
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


# What the runs are compared with: the submitter's published logs at the implementation's
# pinned commit, a miniature's shipped reference runs, or nothing (see mlrepro.reference).
rule reference:
    input:
        implementation_ready,
        reference_runs,
    output:
        "results/{benchmark}/reference.json",
    log:
        "logs/{benchmark}/reference.log",
    localrule: True
    script:
        "../scripts/stage.py"


rule verdict:
    input:
        score="results/{benchmark}/score.json",
        reference="results/{benchmark}/reference.json",
        container=ancient("results/{benchmark}/container.json"),
    output:
        verdict="results/{benchmark}/verdict.json",
        distribution=report("results/{benchmark}/plots/distribution.svg", caption="../report/distribution.rst", category="Plots"),
    log:
        "logs/{benchmark}/verdict.log",
    localrule: True
    script:
        "../scripts/stage.py"


# Every configured benchmark in one table, each row linking to its report.html.
rule final_report:
    input:
        verdicts=expand("results/{benchmark}/verdict.json", benchmark=SETTINGS.benchmarks),
        reports=expand("results/{benchmark}/report.html", benchmark=SETTINGS.benchmarks),
    output:
        html=report("results/report.html", caption="../report/final.rst", category="Final report"),
        csv=report("results/summary.csv", caption="../report/final.rst", category="Final report"),
        json="results/summary.json",
    log:
        "logs/final_report.log",
    localrule: True
    script:
        "../scripts/stage.py"
