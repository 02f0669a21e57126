# Preflight and baseline (seed 003): is this system's node healthy, and what does it reach?
# Logic: mlrepro.preflight (checks, verdicts, env_checklist.md), mlrepro.baseline (the probe) and
# mlrepro.baseline.megatron (workload (a): Megatron-LM runs of the benchmark's GPT).
from mlrepro.baseline import megatron as baseline_megatron
from mlrepro.preflight import run as preflight_run

# config/preflight.yaml validated at parse time: a bad key, or a Megatron layout the node cannot
# hold, stops the DAG before any job.
try:
    PREFLIGHT = preflight_run.load_settings(Path(workflow.basedir))
    MEGATRON_BASELINE = PREFLIGHT["baseline"]["megatron"]
    baseline_megatron.model_of(Path(workflow.basedir), MEGATRON_BASELINE["benchmark"])
    if SYSTEM.device == "cuda":
        baseline_megatron.layout_of(MEGATRON_BASELINE, SYSTEM.gpus_per_node)
except mlrepro_config.ConfigError as error:
    raise config_error(error) from None


def megatron_baseline_rows(wc):
    """The Megatron rows the baseline reads: one run per precision on a CUDA system, none elsewhere
    (there baseline.json says 'not applicable' without starting Megatron-LM)."""
    if SYSTEM.device != "cuda":
        return []
    return layout.megatron_baseline_files(wc.system, MEGATRON_BASELINE["precisions"])


def previous_megatron_run(wc):
    """One Megatron run on the node at a time: each precision waits for the one before it."""
    precisions = MEGATRON_BASELINE["precisions"]
    i = precisions.index(wc.precision)
    return layout.megatron_baseline_files(wc.system, precisions[i - 1:i]) if i else []


wildcard_constraints:
    system=SYSTEM.name,


rule preflight:
    output:
        json="results/preflight/{system}/preflight.json",
        checklist="results/preflight/{system}/env_checklist.md",
    log:
        "logs/preflight/{system}.log",
    params:
        settings=PREFLIGHT,
    resources:
        **slurm_resources(),
        gpus=SYSTEM.gpus_per_node if SYSTEM.device == "cuda" else 0,
    script:
        "../scripts/preflight.py"


rule baseline_megatron:
    input:
        preflight="results/preflight/{system}/preflight.json",
        previous=previous_megatron_run,
    output:
        json=layout.MEGATRON_BASELINE_PATTERN + ".json",
    log:
        stage="logs/baseline/{system}/megatron_{precision}.log",
        megatron=layout.MEGATRON_BASELINE_PATTERN + ".log",
    wildcard_constraints:
        precision="bf16|fp16|fp8",
    params:
        settings=PREFLIGHT,
    resources:
        **slurm_resources(),
        gpus=SYSTEM.gpus_per_node if SYSTEM.device == "cuda" else 0,
    script:
        "../scripts/baseline_megatron.py"


rule baseline:
    input:
        preflight="results/preflight/{system}/preflight.json",
        megatron=megatron_baseline_rows,
    output:
        json="results/baseline/{system}/baseline.json",
        md="results/baseline/{system}/baseline_report.md",
        html="results/baseline/{system}/baseline_report.html",
        plot="results/baseline/{system}/baseline.png",
    log:
        "logs/baseline/{system}.log",
    params:
        settings=PREFLIGHT,
    resources:
        **slurm_resources(),
        gpus=SYSTEM.gpus_per_node if SYSTEM.device == "cuda" else 0,
    script:
        "../scripts/preflight.py"
