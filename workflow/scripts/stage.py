# Every rule calls this one script; rule r of workflow/rules/X.smk runs mlrepro.stages.X.r.
from mlrepro.stages import run_from_snakemake

run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
