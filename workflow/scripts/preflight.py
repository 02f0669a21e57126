# The preflight and baseline rules call this one script; the rule's name picks the stage.
from mlrepro.preflight.run import run_from_snakemake

run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
