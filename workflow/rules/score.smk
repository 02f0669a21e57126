rule score_seed:
    input:
        seed_file("mllog.txt"),
    output:
        seed_file("run.json"),
        # The seed's scored curve as TensorBoard event files, beside every other seed's under results/tensorboard/.
        tensorboard=directory(paths.SCORED_TENSORBOARD_PATTERN),
    log:
        "logs/{benchmark}/score_seed_{seed}.log",
    localrule: True
    script:
        "../scripts/stage.py"


# The score, its verdict against the reference and its report are one job, so that the card's
# target (score.json) also brings the report up to date; seed_results notices a seed deleted to
# be redone.
rule score:
    input:
        unpack(seed_results),
        reference="results/{benchmark}/reference.json",
        container=container_ready,
    output:
        score=report("results/{benchmark}/score.json", caption="../report/score.rst", category="Score"),
        verdict="results/{benchmark}/verdict.json",
        distribution=report("results/{benchmark}/plots/distribution.svg", caption="../report/distribution.rst", category="Plots"),
        html=report("results/{benchmark}/report.html", caption="../report/report.rst", category="Report"),
        convergence=report("results/{benchmark}/plots/convergence.svg", caption="../report/convergence.rst", category="Plots"),
        time_to_train=report("results/{benchmark}/plots/time_to_train.svg", caption="../report/time_to_train.rst", category="Plots"),
    log:
        "logs/{benchmark}/score.log",
    params:
        planned=planned_cost,
    message:
        "score {wildcards.benchmark}; {params.planned}"
    localrule: True
    script:
        "../scripts/stage.py"
