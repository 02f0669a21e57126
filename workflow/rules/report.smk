# The report itself (with the verdict) is written by the score rule (score.smk). Only benchmarks
# with an MLPerf ruleset have a submission package (see all_targets).
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
# pinned commit, a miniature's shipped reference runs, or nothing (see mlrepro.scoring.reference).
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


# Every configured benchmark in one table, each row linking to its report.html; the scores' seeds
# put benchmarks of one model and corpus side by side.
rule final_report:
    input:
        verdicts=expand("results/{benchmark}/verdict.json", benchmark=SETTINGS.benchmarks),
        scores=expand("results/{benchmark}/score.json", benchmark=SETTINGS.benchmarks),
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
