# The report itself is written by the score rule (score.smk). Only benchmarks with an MLPerf
# ruleset have a submission package (see all_targets).
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
