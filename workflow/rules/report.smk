rule report:
    input:
        score="results/{benchmark}/score.json",
        mllogs=seed_files("mllog.txt"),
    output:
        report("results/{benchmark}/report.html", caption="../report/report.rst", category="Report"),
    log:
        "logs/{benchmark}/report.log",
    localrule: True
    script:
        "../scripts/stage.py"
