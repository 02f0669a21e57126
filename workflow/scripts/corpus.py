# Every rule of corpus.smk calls this one script; the rule's name picks the function in mlrepro.corpus.stages.
from mlrepro.corpus.stages import run_from_snakemake

run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
