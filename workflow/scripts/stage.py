# Every rule calls this one script; the rule's name picks the stage in mlrepro.stages.
from mlrepro.stages import run_from_snakemake

run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
