"""Failures priced in the plan: how often to save, and what failures are expected to cost a run.

A long run on many nodes is interrupted as a matter of course: Llama 3 405B lost 419 jobs to unexpected
interruptions in 54 days on 16,384 H100s, and Meta's RSC clusters report 6.5 failures per 1,000 node-days
(Kokolis et al. 2024). With the nodes failing as independent Poisson processes, a run on N nodes fails at
N times a node's rate; each failure loses the work since the last checkpoint and a restart (start-up until
the first new step), a hang also the hang watch's detection delay (mlrepro.launch.attempt.HangRule:
max(600 s, 5 x the longest interval between progress lines), a checkpoint's write being one such interval),
and every checkpoint costs its write. The interval between checkpoints is then computed (Young 1974, with
Daly 2006's higher-order correction), not guessed.

The API, all pure functions of numbers (a caller above this package, e.g. the goodput of measured runs,
gives the measured figures):

    model = FailureModel.of(system.failures)               # the system's `failures:` block (defaults filled)
    model = model.with_measured(restart_seconds=95.0,      # measured figures win over the configured ones
                                checkpoint_seconds=12.0)
    job = model.job(nodes=2, gpus=8, work_s=3600.0,        # productive time: iterations x iteration time
                    checkpoint_bytes=checkpoint_bytes(workload), progress_interval_s=1.2,
                    job_limit_s=None, saves_at_limit=True)
    tau = young_daly_interval(job)                          # seconds of training between checkpoints
    e = expected(job, tau)        # closed form: e.interruptions, e.effective (0..1), e.lost_gpu_hours, e.wall_s
    s = simulate(job, tau, runs=400, seed=0)                # seeded Monte Carlo: the same fields, means over runs

`Job.failure_rate` (per second, the whole job) may also be set directly, e.g. to the rate at which a
test kills attempts: dataclasses.replace(job, failure_rate=1 / 600). Effective training time is
MegaScale's: productive time / total time, from the first step to the last, the first start-up not counted.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mlrepro.plan.workloads import Workload

DAY = 86400.0
# Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (HPCA'25):
# Meta's RSC-1 cluster, 6.5 failures per 1,000 node-days (RSC-2: 2.34). The schema's default.
RSC1_FAILURES_PER_1000_NODE_DAYS = 6.5
# The hang watch's defaults (mlrepro.launch.attempt.HangRule; this layer cannot import it, a test keeps them equal).
HANG_MULTIPLE, HANG_FLOOR_S = 5.0, 600.0


@dataclasses.dataclass(frozen=True)
class FailureModel:
    """A system's failures and what they cost: the `failures:` block of config/systems/<name>.yaml."""

    node_failures_per_1000_node_days: float = RSC1_FAILURES_PER_1000_NODE_DAYS
    restart_seconds: float = 600.0  # start-up until the first new step
    checkpoint_write_gbs: float = 2.0  # per node: every node writes its shards at once
    storage_write_gbs: float | None = None  # the file system's whole write bandwidth, where it caps the nodes'
    checkpoint_seconds: float | None = None  # one save, configured or measured: wins over size / bandwidth
    hang_share: float = 0.1  # failures that stall the run rather than end it
    hang_multiple: float = HANG_MULTIPLE
    hang_floor_seconds: float = HANG_FLOOR_S
    # figure -> where its value came from (default, config/systems/<name>.yaml, measured)
    sources: dict = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, block: dict | None, where: str = "configured", hang: dict | None = None) -> FailureModel:
        """The model of a system's `failures:` block (schema-validated); `hang`: a benchmark's `hang:` block."""
        block, hang = dict(block or {}), dict(hang or {})
        fields = {f.name for f in dataclasses.fields(cls)} - {"sources", "hang_multiple", "hang_floor_seconds"}
        given = {k: v for k, v in block.items() if k in fields and v is not None}
        if "multiple" in hang:
            given["hang_multiple"] = float(hang["multiple"])
        if "floor_seconds" in hang:
            given["hang_floor_seconds"] = float(hang["floor_seconds"])
        return cls(**given, sources={k: where for k in given})

    def with_measured(self, restart_seconds: float | None = None,
                      checkpoint_seconds: float | None = None) -> FailureModel:
        """The model with the figures measured on this system's own runs in place of the configured ones
        (None: not measured yet, the configured figure stays)."""
        measured = {k: float(v) for k, v in (("restart_seconds", restart_seconds),
                                             ("checkpoint_seconds", checkpoint_seconds)) if v is not None}
        return dataclasses.replace(self, **measured, sources={**self.sources, **dict.fromkeys(measured, "measured")})

    def node_rate(self) -> float:
        """Failures per second of one node."""
        return self.node_failures_per_1000_node_days / 1000 / DAY

    def checkpoint_cost(self, checkpoint_bytes: float, nodes: int) -> float:
        """Seconds one save takes: the configured (or measured) figure, else size / write bandwidth."""
        if self.checkpoint_seconds is not None:
            return self.checkpoint_seconds
        bandwidth = self.checkpoint_write_gbs * nodes
        if self.storage_write_gbs:
            bandwidth = min(bandwidth, self.storage_write_gbs)
        return checkpoint_bytes / (bandwidth * 1e9)

    def hang_seconds(self, longest_quiet_s: float) -> float:
        """How long a hang goes unnoticed: the hang watch's timeout for the longest quiet interval."""
        return max(self.hang_floor_seconds, self.hang_multiple * longest_quiet_s)

    def job(self, *, nodes: int, gpus: int, work_s: float, checkpoint_bytes: float = 0.0,
            progress_interval_s: float = 0.0, job_limit_s: float | None = None, saves_at_limit: bool = True,
            saves: bool = True) -> Job:
        """One run of `gpus` GPUs on `nodes` nodes that trains for `work_s` seconds without failures;
        `job_limit_s`: the usable span of one job of a chain (its limit less the margin), None for one job."""
        checkpoint_s = self.checkpoint_cost(checkpoint_bytes, nodes) if saves else 0.0
        return Job(nodes=nodes, gpus=gpus, work_s=float(work_s), failure_rate=nodes * self.node_rate(),
                   restart_s=self.restart_seconds, checkpoint_s=checkpoint_s, hang_share=self.hang_share,
                   hang_s=self.hang_seconds(max(progress_interval_s, checkpoint_s)), job_limit_s=job_limit_s,
                   saves_at_limit=saves_at_limit, saves=saves)


@dataclasses.dataclass(frozen=True)
class Job:
    """What the closed form and the simulator take: one run's scale, its failures and its costs, in seconds."""

    nodes: int
    gpus: int
    work_s: float  # productive time: iterations x iteration time
    failure_rate: float  # failures per second of the whole job (nodes x a node's rate)
    restart_s: float
    checkpoint_s: float
    hang_share: float
    hang_s: float  # detection delay of a hang
    job_limit_s: float | None = None  # usable span of one job of a chain; None: no limit
    saves_at_limit: bool = True  # the trainer saves at the limit (the chain's margin); False: that work is lost
    saves: bool = True  # False: a failure restarts the run from its beginning

    @property
    def mtbf_s(self) -> float:
        return 1 / self.failure_rate if self.failure_rate > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class Expectation:
    interval_s: float
    wall_s: float  # first step to last, the expected value
    interruptions: float  # unexpected, i.e. failures
    planned_restarts: float  # the chain's job limits
    effective: float  # productive / wall
    lost_gpu_hours: float  # GPUs x (wall - productive): failures, restarts and the checkpoints against them
    spread: float = 0.0  # the simulator's standard deviation of `effective` over its runs (closed form: 0)


def checkpoint_bytes(w: Workload) -> float:
    """What one save writes: every trainable parameter's weight and Adam state, at the memory model's bytes
    per parameter (workloads.Training: weights, then fp32 master, momentum and variance); not gradients.
    Each parameter is saved once, whatever the layout."""
    return w.model.trainable_params() * (w.training.param_bytes + w.training.optimizer_bytes)


def seconds_words(x: float) -> str:
    """Seconds as a plan shows them: three figures below 100 s (a miniature's 0.069 s save), whole above."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def costs_words(model: FailureModel, job: Job, checkpoint_bytes: float | None) -> str:
    """'MTBF 1,846.2 h on 2 node(s), restart 600 s (configured), a save 12.3 s (measured)': the failure rate and
    the two costs a plan priced, each saying where it came from: `measured` (the benchmark's own seeds, through
    with_measured), `configured` (the system's `failures:` block, its schema defaults included), or the
    checkpoint's size over the configured write bandwidth (`checkpoint_bytes`; None: the size is unknown, an
    implementation the planner has no model of, and a save counts as free until one is measured)."""
    def source(figure: str) -> str:
        return "measured" if model.sources.get(figure) == "measured" else "configured"

    if model.checkpoint_seconds is not None:
        save = source("checkpoint_seconds")
    elif checkpoint_bytes:
        save = f"{checkpoint_bytes / 1e9:.3g} GB at the configured write bandwidth"
    else:
        save = "size unknown: free until a save is measured"
    return (f"MTBF {job.mtbf_s / 3600:,.1f} h on {job.nodes} node(s), restart {seconds_words(job.restart_s)} s "
            f"({source('restart_seconds')}), a save {seconds_words(job.checkpoint_s)} s ({save})")


def young_daly_interval(job: Job) -> float:
    """Seconds of training between saves: Daly 2006's higher-order optimum sqrt(2 d M)(1 + sqrt(d/2M)/3
    + d/18M) - d for a save costing d and a job MTBF M (Young 1974's sqrt(2 d M) to first order; M itself
    when d >= 2M); never longer than one job of a chain can train after its start-up."""
    d, m = job.checkpoint_s, job.mtbf_s
    if not math.isfinite(m):
        tau = math.inf
    elif d <= 0:
        tau = math.sqrt(2 * 1.0 * m)  # a free save: as often as a second's worth would be worth it
    elif d < 2 * m:
        x = d / (2 * m)
        tau = math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d
    else:
        tau = m
    if job.job_limit_s and job.job_limit_s - job.restart_s - d > 0:
        tau = min(tau, job.job_limit_s - job.restart_s - d)
    return min(tau, job.work_s) if job.work_s > 0 else tau


def _complete(a: float, lam: float, dead: float) -> tuple[float, float]:
    """(expected time, expected failures) to finish `a` seconds of uninterrupted work when failures come
    at rate `lam` and each costs `dead` seconds before the work starts over (exponential failures)."""
    if lam <= 0:
        return a, 0.0
    tries = math.expm1(lam * a) if lam * a < 700 else math.inf
    return tries * (1 / lam + dead), tries


def expected(job: Job, interval_s: float | None = None) -> Expectation:
    """The closed form. Without a job limit it is exact for the simulator's model: n = ceil(W / tau)
    segments, each of tau + d but the last (no save at the end), each finished in (e^(lam a) - 1)
    (1/lam + hang share x hang delay + the restart's own expected time) (Daly 2006's exponential model).
    With a job limit it is the renewal-reward rate of one job (start-up, saves, then a failure or the
    limit), which leaves out the first job's start-up and the run's last partial job."""
    lam, h, hd, r, d, w = (job.failure_rate, job.hang_share, job.hang_share * job.hang_s, job.restart_s,
                           job.checkpoint_s, job.work_s)
    if not job.saves:
        tau, d = math.inf, 0.0
    else:
        tau = interval_s if interval_s is not None else young_daly_interval(job)
    restart_time, restart_failures = _complete(r, lam, hd)
    limit = job.job_limit_s
    if limit is None or (not job.saves and w <= limit - r):
        n = max(1, math.ceil(w / tau)) if math.isfinite(tau) else 1
        last = w - (n - 1) * tau if n > 1 else w
        t_full, f_full = _complete(tau + d, lam, hd + restart_time) if n > 1 else (0.0, 0.0)
        t_last, f_last = _complete(last, lam, hd + restart_time)
        wall = (n - 1) * t_full + t_last
        failures = ((n - 1) * f_full + f_last) * (1 + restart_failures)
        planned = 0.0
    elif not job.saves:
        wall, failures, planned = math.inf, math.inf, math.inf  # never finishes: each job starts over
    else:
        c = tau + d
        span = max(limit - r, 0.0)  # a job over before its start-up trains nothing: the run never finishes
        k = math.floor(span / c)
        survive = math.exp(-lam * limit)
        mean_span = (1 - survive) / lam if lam > 0 else limit
        # A failure at t in (r + j c, r + (j+1) c) leaves j saves made: sum over j of P(r + j c <= t < limit).
        saved = tau * sum(math.exp(-lam * (r + j * c)) - survive for j in range(1, k + 1))
        x = span - k * c
        at_limit = k * tau + (min(x, tau) if job.saves_at_limit else 0.0)
        extra = ((d if x <= tau else c - x) if job.saves_at_limit else 0.0)
        work = saved + survive * at_limit
        duration = mean_span + (1 - survive) * h * job.hang_s + survive * extra
        if work <= 0:
            wall, failures, planned = math.inf, math.inf, math.inf
        else:
            wall = w / work * duration
            failures, planned = wall * (1 - survive) / duration, wall * survive / duration
    effective = w / wall if w > 0 and math.isfinite(wall) else (1.0 if w <= 0 else 0.0)
    lost = job.gpus * (wall - w) / 3600 if math.isfinite(wall) else math.inf
    return Expectation(interval_s=tau, wall_s=wall, interruptions=failures, planned_restarts=planned,
                       effective=effective, lost_gpu_hours=lost)


def simulate(job: Job, interval_s: float | None = None, *, runs: int = 400, seed: int = 0,
             max_jobs: int = 200_000, first_start_up: bool = False) -> Expectation:
    """The seeded Monte Carlo of the same run, `runs` times, all runs advanced together one job (a start
    after a failure or a limit) at a time. The nodes fail as independent Poisson processes: the first of
    N failing is exponential at N times a node's rate (the superposition), and each failure is a hang with
    probability hang_share. Within a job: the start-up (none for the first), then saves every interval; a
    failure keeps what the last finished save holds; at the job limit the trainer saves what it has (or
    loses it); the run ends at its last step, unsaved. A run still unfinished after `max_jobs` jobs
    counts as never finishing (effective 0). `first_start_up`: the first job starts up too, and its time
    counts (a measured seed's attempts are timed from their start, the first one's included)."""
    lam, w = job.failure_rate, job.work_s
    tau = math.inf if not job.saves else (interval_s if interval_s is not None else young_daly_interval(job))
    d = job.checkpoint_s if job.saves else 0.0
    c = tau + d
    limit = job.job_limit_s if job.job_limit_s is not None else math.inf
    rng = np.random.default_rng(seed)
    done = np.zeros(runs)
    wall = np.zeros(runs)
    failures = np.zeros(runs)
    planned = np.zeros(runs)
    # The first job's start-up is before the first step: not counted, unless a measurement counts it.
    startup = np.full(runs, job.restart_s if first_start_up else 0.0)
    active = np.ones(runs, dtype=bool)
    if limit <= job.restart_s:
        max_jobs = 1  # only the first job, which has no start-up, can train: after it the run never finishes
    for _ in range(max_jobs):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        left = w - done[idx]
        if math.isfinite(tau):
            full = np.maximum(np.ceil(left / tau) - 1, 0)
            need = startup[idx] + full * c + (left - full * tau)
        else:
            need = startup[idx] + left
        fail_at = rng.exponential(1 / lam, idx.size) if lam > 0 else np.full(idx.size, np.inf)
        hang = rng.random(idx.size) < job.hang_share
        finish = need <= np.minimum(fail_at, limit)
        failed = ~finish & (fail_at < limit)
        stopped = ~finish & ~failed
        trained = np.maximum(np.minimum(fail_at, limit) - startup[idx], 0.0)
        saves = np.floor(trained / c) if math.isfinite(c) else np.zeros(idx.size)
        kept = saves * (tau if math.isfinite(tau) else 0.0)
        extra = np.zeros(idx.size)
        if job.saves_at_limit and math.isfinite(tau):
            x = trained - saves * c
            kept = np.where(stopped, kept + np.minimum(x, tau), kept)
            extra = np.where(stopped, np.where(x <= tau, d, c - x), 0.0)
        elapsed = np.where(finish, need, np.where(failed, fail_at + hang * job.hang_s, limit + extra))
        wall[idx] += elapsed
        done[idx] = np.where(finish, w, done[idx] + np.where(finish, 0.0, kept))
        failures[idx] += failed
        planned[idx] += stopped
        startup[idx] = job.restart_s
        active[idx[finish]] = False
    wall = np.where(active, np.inf, wall)
    per_run = np.where(np.isfinite(wall), w / np.where(wall > 0, wall, 1.0), 0.0) if w > 0 else np.ones(runs)
    mean_wall = float(wall.mean())
    # As the closed form: productive time over the expected wall time (not the mean of the runs' ratios).
    effective = w / mean_wall if w > 0 and math.isfinite(mean_wall) else (1.0 if w <= 0 else 0.0)
    return Expectation(interval_s=tau, wall_s=mean_wall, interruptions=float(failures.mean()),
                       planned_restarts=float(planned.mean()), effective=effective,
                       lost_gpu_hours=job.gpus * (mean_wall - w) / 3600 if math.isfinite(mean_wall) else math.inf,
                       spread=float(per_run.std()))


def steady(job: Job, interval_s: float | None = None) -> Expectation:
    """The expectation of a run many MTBFs long (its length unknown): effective training time is then a
    rate that depends on the scale and the costs alone."""
    long = 1000 * max(job.mtbf_s if math.isfinite(job.mtbf_s) else 0.0, DAY)
    return expected(dataclasses.replace(job, work_s=long), interval_s)


def time_to_train(model: FailureModel, w: Workload, *, nodes: int, gpus: int, seconds: float, step_s: float,
                  per_step: bool) -> float:
    """`seconds` of the planner's estimate with the expected failure losses at this scale added: a step of a
    run of unknown length (per_step; a GPT of a fixed global batch) saving at the Young/Daly interval costs
    step / effective training time; a whole run (an MLPerf benchmark's time to train) never saves (MLPerf's
    timed runs do not), so a failure starts it over."""
    job = model.job(nodes=nodes, gpus=gpus, work_s=seconds, checkpoint_bytes=checkpoint_bytes(w),
                    progress_interval_s=step_s, saves=per_step)
    return seconds / steady(job).effective if per_step else expected(job).wall_s


def measured_prediction(measured: dict | None, mtbf_s: float | None, *, job_limit_s: float | None = None,
                        runs: int = 4000, seed: int = 0) -> dict | None:
    """What the model predicts for a measured benchmark whose attempts failed at a known mean time (the
    `inject_failures:` knob): each seed a run of the seeds' mean productive time, failing at 1/mtbf_s while
    an attempt runs (its start-up included), at the restart and checkpoint costs and the checkpoint interval
    the seeds measured (`measured`: mlrepro.scoring.goodput's benchmark record). None where a figure is
    missing (no checkpoint measured, no resumed attempt)."""
    if not measured:
        return None
    seeds = len(measured.get("seeds") or {}) or 1
    need = ("productive_s", "restart_cost_s", "checkpoint_interval_steps", "step_s")
    if mtbf_s is None or mtbf_s <= 0 or any(measured.get(k) is None for k in need):
        return None
    work = measured["productive_s"] / seeds
    interval = measured["checkpoint_interval_steps"] * measured["step_s"]
    job = Job(nodes=1, gpus=1, work_s=work, failure_rate=1 / mtbf_s, restart_s=measured["restart_cost_s"],
              checkpoint_s=measured.get("checkpoint_cost_s") or 0.0, hang_share=0.0, hang_s=0.0,
              job_limit_s=job_limit_s)
    sim = simulate(job, interval, runs=runs, seed=seed, first_start_up=True)
    return {"effective": sim.effective, "interruptions_per_seed": sim.interruptions,
            # the spread of a mean over this many seeds: what the measurement may differ by
            "spread": sim.spread / math.sqrt(seeds),
            "method": (f"mlrepro.plan.goodput.simulate, {runs} runs: a seed of {work:.1f} s productive, "
                       f"MTBF {mtbf_s:g} s, restart {measured['restart_cost_s']:.2f} s, a save every "
                       f"{interval:.1f} s costing {job.checkpoint_s:.2f} s")}
