"""The workflow's rules as plain functions: rule r of workflow/rules/X.smk is mlrepro.stages.X.r.

workflow/scripts/stage.py hands every rule's job to `run_from_snakemake`, the one dispatcher: it
finds the rule's function, asks it what it takes of Snakemake's job (mlrepro.stages.process.rule)
and runs it inside stage_process. The functions take paths and names only, so they are tested
without Snakemake. Libraries never import this package.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from types import ModuleType

from mlrepro import config as mlrepro_config
from mlrepro.stages import process

# One module per rule file (workflow/rules/<name>.smk); common.smk holds no rule.
RULE_FILES = ("container", "data", "model", "train", "score", "report", "corpus", "preflight", "baseline")


def rules(module: ModuleType) -> dict:
    """The rule functions of a stage module, by name."""
    return {name: fn for name, fn in vars(module).items()
            if callable(fn) and hasattr(fn, "snakemake_arguments") and fn.__module__ == module.__name__}


def find(rule: str):
    """The stage module and function of a rule."""
    for name in RULE_FILES:
        module = importlib.import_module(f"mlrepro.stages.{name}")
        if rule in rules(module):
            return module, getattr(module, rule)
    raise LookupError(f"no stage function for rule {rule!r} in mlrepro.stages.{{{','.join(RULE_FILES)}}}")


def run_from_snakemake(smk) -> None:
    module, fn = find(smk.rule)
    with process.stage_process(process.log_file(fn, smk)):
        settings = mlrepro_config.load(smk.config, Path.cwd())
        args, kwargs = fn.snakemake_arguments(smk, settings)
        errors = getattr(module, "user_errors", process.user_errors)()
        try:
            fn(*args, **kwargs)
        except errors as exc:
            logging.getLogger("mlrepro").error("%s", exc)
            sys.exit(1)
