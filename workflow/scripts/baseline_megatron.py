# One Megatron-LM run of the baseline (workload (a)); the logic is mlrepro.baseline.megatron.
from mlrepro.baseline.megatron import run_from_snakemake

run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
