"""The rule of workflow/rules/train.smk: one seed run, retried, its log kept as its result."""

from __future__ import annotations

import logging
from pathlib import Path

from mlrepro import kinds
from mlrepro.launch import adopt, auto, chain, finished, job
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
    job.verify_inputs(plan, settings.root)
    job.write_plan(plan)
    limits = chain.limits(bench.segments, settings.system.max_job_minutes)
    if limits is None and adopted(kind, bench, plan, log_path, out):
        return
    for attempt in range(bench.retries + 1):
        try:
            auto.run_seed_chain(plan, settings.system, log_path, limits)
            kind.finish_seed(bench, plan, log_path, out)
            finished.record(plan.seed_dir, out)
            return
        except job.SeedFailed as exc:
            if attempt == bench.retries or not exc.retry:
                raise
            log.warning("%s; retrying (%d of %d)", exc, attempt + 1, bench.retries)



def adopted(kind, bench, plan: job.SeedPlan, log_path: Path, out: Path) -> bool:
    """Whether an attempt a killed workflow left finished (mlrepro.launch.adopt) is the seed's result."""
    if not adopt.take_finished_attempt(plan, log_path):
        return False
    try:
        kind.finish_seed(bench, plan, log_path, out)
    except job.SeedFailed as exc:
        log.info("%s; training again", exc)
        return False
    finished.record(plan.seed_dir, out)
    log.info("%s seed %d: the finished run of an earlier workflow kept, not trained again", bench.name, plan.seed)
    return True
