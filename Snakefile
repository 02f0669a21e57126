# mlrepro: implementation -> container -> dataset -> checkpoint -> seed runs -> scores -> report.
# Rules live in workflow/rules/, one file per stage (rule r of X.smk runs mlrepro.stages.X.r);
# common.smk loads and validates the config.

include: "workflow/rules/common.smk"
include: "workflow/rules/container.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/baseline.smk"


rule all:
    input:
        all_targets(),
        corpus_tasks.targets({n: SETTINGS.corpora[n] for n in SETTINGS.default_corpora}, workflow.basedir),
    default_target: True
