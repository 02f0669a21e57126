# Baseline (the baseline checklist): what this system's node reaches, once its preflight passed.
# Logic: mlrepro.stages.baseline; mlrepro.baseline (the probe) and mlrepro.baseline.megatron
# (workload (a): Megatron-LM runs of the benchmark's GPT, one precision after the other).
rule baseline_megatron:
    input:
        preflight="results/preflight/{system}/preflight.json",
        previous=previous_megatron_run,
    output:
        json=f"{paths.MEGATRON_BASELINE_PATTERN}.json",
    log:
        stage="logs/baseline/{system}/megatron_{precision}.log",
        megatron=f"{paths.MEGATRON_BASELINE_PATTERN}.log",
    wildcard_constraints:
        precision="bf16|fp16|fp8",
    params:
        settings=PREFLIGHT,
    resources:
        **slurm_resources(),
        gpus=SYSTEM.gpus_per_node if SYSTEM.device == "cuda" else 0,
    script:
        "../scripts/stage.py"


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
        "../scripts/stage.py"
