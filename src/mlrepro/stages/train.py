"""The rules of workflow/rules/train.smk: one seed run, retried, its log kept as its result; and the
opt-in trial whose measured fastest layout a GPT benchmark's seeds run."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from mlrepro import kinds, paths
from mlrepro.kinds import plan_trial
from mlrepro.launch import adopt, auto, chain, finished, job
from mlrepro.scoring import early_stop
from mlrepro.scoring import rules as scoring_rules
from mlrepro.stages import container
from mlrepro.stages.process import OWN, rule

log = logging.getLogger("mlrepro.stages")


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, int(smk.wildcards.seed), Path(smk.output[0]),
                       Path(smk.log[0])), {}), log=OWN)
def train_seed(settings, benchmark: str, seed: int, out: Path, log_path: Path) -> None:
    """Run the seed's attempts (mlrepro.launch: each ended attempt classed, one budget of `retries` failed
    attempts). Its plan is made once, here, and kept in the seed folder (plan.json) for the score and
    `mlrepro status`.

    With the opt-in early stop (mlrepro.scoring.early_stop) a settled reproduction submits nothing
    more: the seed is marked stopped instead; after each finished seed the outcome is looked at."""
    bench = settings.benchmark(benchmark)
    if (decision := early_stop.read_decision(settings.root, benchmark)) is not None:
        # Settled: delete early_stop.json and the stopped seeds' folders to go on anyway.
        early_stop.mark_stopped(paths.seed_dir(settings.root, benchmark, seed), out, decision, cancelled=False)
        log.info("%s seed %d not run: %s", benchmark, seed, decision["message"])
        return
    kind = kinds.of(bench)
    plan = kind.prepare(settings, benchmark, seed)
    log.info("%s seed %d: %s", benchmark, seed, plan.describe())
    container.current_image(settings, benchmark)
    job.verify_inputs(plan, settings.root)
    job.write_plan(plan)
    limits = chain.limits(bench.segments, settings.system.max_job_minutes)
    # A seed cancelled as diverged by an earlier invocation runs again when the workflow is run again.
    plan.files.diverged.unlink(missing_ok=True)
    if adopted(kind, bench, plan, log_path, out, chained=limits is not None):
        return
    with _band_watch(settings, bench, plan):
        try:
            auto.run_seed_attempts(plan, settings.system, log_path, limits, bench.retries,
                                   finish=lambda: kind.finish_seed(bench, plan, log_path, out))
        except job.EarlyStopped as exc:
            log.info("%s", exc)
            early_stop.mark_stopped(plan.seed_dir, out, early_stop.read_decision(settings.root, benchmark) or {},
                                    cancelled=True)
            return
    finished.record(plan.seed_dir, out)
    _learn(settings, bench, kind, plan, out)
    _look_at_the_outcome(settings, bench, plan)


def _learn(settings, bench, kind, plan: job.SeedPlan, out: Path) -> None:
    """A kind that plans its own layout keeps the seed's measured step beside the plan's prediction
    (kinds.megatron.learn: the next plan for this system starts from it). Never fails the seed."""
    if not hasattr(kind, "learn"):
        return
    try:
        kept = kind.learn(settings, bench, plan, out)
    except Exception as exc:  # the seed's result stands whatever the look at it does
        log.warning("%s seed %d: step time not kept for the planner: %s", bench.name, plan.seed, exc)
        return
    if kept:
        log.info("%s seed %d: measured %.4f s per step, the plan predicted %s s (kept for %s)", bench.name,
                 plan.seed, kept["measured_s"], kept["predicted_s"], settings.system.name)


def _look_at_the_outcome(settings, bench, plan: job.SeedPlan) -> None:
    """After a finished seed: is the reproduction settled (the opt-in early stop)? Never fails the seed."""
    try:
        decision = early_stop.evaluate(settings.root, bench, settings.system, scoring_rules.for_benchmark(bench),
                                       plan.gpus_per_node, settings.system.device)
    except Exception as exc:  # the seed's result stands whatever the look at it does
        log.warning("%s: early stop not evaluated: %s", bench.name, exc)
        return
    if decision is not None:
        log.warning("%s: %s", bench.name, decision["message"])


@contextlib.contextmanager
def _band_watch(settings, bench, plan: job.SeedPlan):
    """With early_stop.cancel_diverged on: a watcher that marks the running seed diverged once its
    evaluations leave the reference runs' band; its backend then cancels it."""
    policy = early_stop.policy_of(bench, settings.system)
    rules = scoring_rules.for_benchmark(bench)
    curves = (early_stop.reference_curves(settings.root, bench, rules)
              if policy and policy.cancel_diverged and not bench.is_pretrain else [])
    if not curves:
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=early_stop.watch_band, daemon=True,
                               args=(plan.seed_dir, curves, rules, plan.files.diverged, stop))
    watcher.start()
    try:
        yield
    finally:
        stop.set()


def adopted(kind, bench, plan: job.SeedPlan, log_path: Path, out: Path, chained: bool) -> bool:
    """Whether an attempt a killed workflow left finished (mlrepro.launch.adopt) is the seed's result;
    of a chained seed, only its last segment's (an earlier one is recorded, and the chain goes on)."""
    if not adopt.take_finished_attempt(plan, log_path):
        return False
    if chained and not chain.take_back(plan.seed_dir, log_path):
        return False
    try:
        kind.finish_seed(bench, plan, log_path, out)
    except job.SeedFailed as exc:
        log.info("%s; training again", exc)
        return False
    finished.record(plan.seed_dir, out)
    log.info("%s seed %d: the finished run of an earlier workflow kept, not trained again", bench.name, plan.seed)
    return True


@rule(lambda smk, s: ((s, smk.wildcards.benchmark), {}))
def trial(settings, benchmark: str) -> None:
    """The benchmark's `pretrain: trial:` (mlrepro.kinds.plan_trial): its candidates run as jobs, the
    measured fastest written as the choice into trials.json, which the seeds' plans read
    (mlrepro.pretrain.megatron_plan.chosen)."""
    record = plan_trial.run_benchmark_trial(settings, benchmark)
    for row in record["candidates"]:
        measured = f"measured {row['measured_s']} s" if row["measured_s"] else f"not measured ({row['error']})"
        log.info("%s trial rank %d %s: predicted %s s, %s", benchmark, row["rank"], row["layout"], row["predicted_s"],
                 measured)
    log.info("%s: the seeds run %s (the measured fastest; the trials spent %.4g %s)", benchmark,
             record["chosen"]["layout"], record["gpu_hours"], record["unit"])
