# Every rule calls this one script; rule r of workflow/rules/X.smk runs mlrepro.stages.X.r.
from mlrepro.stages import run_from_snakemake

# Guarded: a stage that starts processes with multiprocessing's spawn (the preflight's all_reduce ranks)
# has each child import this file again as __mp_main__, where Snakemake injected no `snakemake`.
if __name__ == "__main__":
    run_from_snakemake(snakemake)  # noqa: F821 (injected by Snakemake's script directive)
