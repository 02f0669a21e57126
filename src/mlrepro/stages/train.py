"""The rule of workflow/rules/train.smk: one seed run, retried, its log kept as its result."""

from __future__ import annotations

import logging
from pathlib import Path

from mlrepro import kinds
from mlrepro.launch import auto, chain, job
from mlrepro.stages import container
from mlrepro.stages.process import OWN, rule

log = logging.getLogger("mlrepro.stages")


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, int(smk.wildcards.seed), Path(smk.output[0]),
                       Path(smk.log[0])), {}), log=OWN)
def train_seed(settings, benchmark: str, seed: int, out: Path, log_path: Path) -> None:
    """Run the seed, retrying a failed attempt up to the benchmark's `retries` times. Its plan is made
    once, here, and kept in the seed folder (plan.json) for the score and `mlrepro status`."""
    bench = settings.benchmark(benchmark)
    kind = kinds.of(bench)
    plan = kind.prepare(settings, benchmark, seed)
    log.info("%s seed %d: %s", benchmark, seed, plan.describe())
    container.current_image(settings, benchmark)
    job.verify_inputs(plan, settings.root)
    job.write_plan(plan)
    limits = chain.limits(bench.segments, settings.system.max_job_minutes)
    for attempt in range(bench.retries + 1):
        try:
            auto.run_seed_chain(plan, settings.system, log_path, limits)
            kind.finish_seed(bench, plan, log_path, out)
            return
        except job.SeedFailed as exc:
            if attempt == bench.retries or not exc.retry:
                raise
            log.warning("%s; retrying (%d of %d)", exc, attempt + 1, bench.retries)

