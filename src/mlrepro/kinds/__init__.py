"""The two kinds of benchmark behind one small interface: an MLPerf implementation (kinds.mlperf) and a
Megatron-LM pretraining run (kinds.megatron). `of(bench)` gives the benchmark's kind, a module with:

    plan_seed(settings, benchmark, seed) -> SeedPlan     the plan the seed runs (mlrepro.launch.job)
    dag_plan(settings, benchmark, seed) -> SeedPlan      what `snakemake -n` shows and reserves for it
    dag_plans(settings, benchmark) -> {seed: SeedPlan}   dag_plan of every listed seed, planned together
    prepare(settings, benchmark, seed) -> SeedPlan       the plan, with what it runs put in place
    implementation_folder(bench, system) -> Path         the folder the seeds run and the image is built from
    corpus_folder(root, bench) -> Path | None            the corpus whose blend the seeds read
    finish_seed(bench, plan, run_log, out)               the seed's log kept as its result, or SeedFailed
    score_seed(settings, bench, seed, log, plan) -> dict the seed's run record
    unmet(root, bench, system, with_implementation=)     what the system lacks for it (kinds.systems asks)
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mlrepro.config import Benchmark


def of(bench: Benchmark) -> ModuleType:
    """The benchmark's kind: a `pretrain:` block makes it a Megatron-LM pretraining run."""
    return importlib.import_module("mlrepro.kinds.megatron" if bench.is_pretrain else "mlrepro.kinds.mlperf")
