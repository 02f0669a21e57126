"""`python -m mlrepro.stages RULE ...`: the dispatcher for the rules that run their stage from `shell:`.

The per-seed rules (train_seed, score_seed) are `shell:` rules: a dry run reads a `script:` rule's
source once per job, and with hundreds of seeds that was a third of the DAG's time (issue 22). The
command hands over what a script rule's `snakemake` object would (the rule, wildcards, files,
threads); the workflow's configuration comes from the environment the workflow gives its local jobs
(CONFIG_ENV, set in common.smk). The same run_from_snakemake then runs the stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

from mlrepro.stages import CONFIG_ENV, run_from_snakemake


def job_from_command(argv: list[str]) -> SimpleNamespace:
    """What run_from_snakemake reads of a job, from the shell rule's command line and CONFIG_ENV."""
    parser = argparse.ArgumentParser(prog="python -m mlrepro.stages", description=__doc__.splitlines()[0])
    parser.add_argument("rule")
    parser.add_argument("--wildcard", action="append", default=[], metavar="NAME=VALUE")
    for files in ("input", "output", "log"):
        parser.add_argument(f"--{files}", nargs="*", default=[])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if CONFIG_ENV not in os.environ:
        parser.error(f"{CONFIG_ENV} is not set: this command is run by the workflow's rules, not by hand")
    wildcards = dict(item.partition("=")[::2] for item in args.wildcard)
    return SimpleNamespace(rule=args.rule, wildcards=SimpleNamespace(**wildcards), input=args.input,
                           output=args.output, log=args.log, threads=args.threads, params=SimpleNamespace(),
                           config=json.loads(os.environ[CONFIG_ENV]))


if __name__ == "__main__":
    run_from_snakemake(job_from_command(sys.argv[1:]))
