# Preflight and baseline (seed 003): is this system's node healthy, and what does it reach?
# Logic: mlrepro.preflight (checks, verdicts, env_checklist.md) and mlrepro.baseline (the probe).
from mlrepro.preflight import run as preflight_run

# config/preflight.yaml validated at parse time: a bad key stops the DAG before any job.
try:
    PREFLIGHT = preflight_run.load_settings(Path(workflow.basedir))
except mlrepro_config.ConfigError as error:
    raise config_error(error) from None


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


rule baseline:
    input:
        "results/preflight/{system}/preflight.json",
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
