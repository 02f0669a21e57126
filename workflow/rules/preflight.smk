# Preflight (the baseline checklist): is this system's node healthy? What it reaches is baseline.smk's.
# Logic: mlrepro.stages.preflight; mlrepro.preflight (checks, verdicts, env_checklist.md).
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
        "../scripts/stage.py"
