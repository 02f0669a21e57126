"""Choose the layout: enumerate what the divisibility rules allow, price each candidate with the
memory and cost models, and let an integer program in pulp select the fastest one that fits.

The program has one binary per candidate layout (TP, PP, CP, DP, VPP, MBS, GA, SP, recompute,
FP8_ACT), exactly one chosen, the chosen one's predicted memory at most GPU memory x margin and
its TP group inside the NVLink domain; the objective is the step time (fixed GBS) or the time to
train (steps to the RCP's samples x step time); among layouts within 1% of the fastest the
simplest (most data-parallel) is taken, in a second solve. A candidate that another beats on
memory, time, TP and simplicity at once can never be chosen, so only the Pareto front enters the
program (and of the micro-batch counts that share a memory footprint only the fastest), which
keeps it small at 1,024 GPUs. The feasible rest is still ranked for the table.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import warnings

import pandas as pd
import pulp

from mlrepro.plan import cost, goodput, memory
from mlrepro.plan.hardware import SystemFacts
from mlrepro.plan.layout import Layout
from mlrepro.plan.workloads import Workload

DEFAULT_MARGIN = 0.95
DEFAULT_TOLERANCE = 0.01
# MINIBS values tried for benchmarks whose GBS is MINIBS x DP: powers of two and the values
# NVIDIA's v5.0 configs use (24, 56, 64, 72, 112, 288).
GA_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 56, 64, 72, 96, 112, 128, 144, 192, 256, 288, 384, 512,
              576, 768, 1024)

REASONS = {
    "divide": "TP x PP x CP does not divide the GPU count",
    "heads": "attention heads (or KV groups) not divisible by TP",
    "nvlink": "TP group larger than the NVLink domain",
    "layers": "layers not divisible by PP",
    "seq": "sequence not divisible into 2 x CP chunks",
    "gbs": "GBS not divisible by MBS x DP",
    "vpp": "GBS not divisible by DP x VPP (the implementation's interleaving rule)",
    "rcp": "GBS above the largest batch size with reference convergence points",
    "memory": "predicted memory above GPU memory x margin",
}


class PlanError(ValueError):
    """No layout can run; the message says why, with numbers."""


@dataclasses.dataclass
class Plan:
    workload: Workload
    facts: SystemFacts
    margin: float
    best: Candidate
    table: pd.DataFrame  # best plans first, the chosen one at rank 1
    rejected: collections.Counter
    evaluated: int
    solve_seconds: float

    @property
    def layout(self) -> Layout:
        return self.best.layout

    def rejected_table(self) -> pd.DataFrame:
        rows = [{"reason": REASONS[k], "layouts": v} for k, v in (+self.rejected).most_common()]
        return pd.DataFrame(rows, columns=["reason", "layouts"])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _options(w: Workload, tp: int):
    recomputes = ("none", "full") if w.training.flash_attention else ("none", "selective", "full")
    sps = (False, True) if tp > 1 else (False,)
    fp8s = (False, True) if w.training.fp8_act_knob and w.model.mlp == "swiglu" else (False,)
    return [(mbs, sp, rc, f8) for mbs in w.mbs_choices for sp in sps for rc in recomputes for f8 in fp8s]


def _gas(w: Workload, mbs: int, dp: int, largest: int | None) -> tuple[list[int], int, int]:
    """(micro-batch counts allowed, rejected for divisibility, rejected for the RCP range)."""
    if w.fixed_gbs:
        if w.gbs % (mbs * dp):
            return [], 1, 0
        return [w.gbs // (mbs * dp)], 0, 0
    ok = [ga for ga in GA_CHOICES if largest is None or mbs * ga * dp <= largest]
    return ok, 0, len(GA_CHOICES) - len(ok)


class Candidate:
    """One priced layout; light, because there are tens of thousands at 1,024 GPUs."""

    __slots__ = ("base", "ga", "mem", "parts", "steps", "memory_gb", "objective_s", "tp", "simplicity")

    def __init__(self, base: Layout, ga: int, mem: memory.Memory, parts: cost.MicroBatch, steps: int | None):
        self.base, self.ga, self.mem, self.parts, self.steps = base, ga, mem, parts, steps
        self.memory_gb = mem.total / memory.GB
        step = parts.step(ga, base.pp, base.vpp).total
        self.objective_s = step * steps if steps is not None else step
        self.tp = base.tp
        # Lower is simpler: fewer GPUs per model replica, then no recompute, no FP8 activations,
        # and the smaller TP (whose price rests most on an assumed overlap, tp_comm_overlap).
        self.simplicity = (base.tp * base.cp * base.pp + 0.01 * (base.recompute != "none")
                           + 0.01 * base.fp8_act + 0.001 * base.tp)

    @property
    def layout(self) -> Layout:
        return dataclasses.replace(self.base, ga=self.ga)

    def row(self) -> dict:
        lay = self.layout
        step = self.parts.step(self.ga, lay.pp, lay.vpp)
        return {
            "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vpp": lay.vpp, "mbs": lay.mbs, "ga": lay.ga,
            "gbs": lay.gbs, "sp": lay.sp, "recompute": lay.recompute, "fp8_act": lay.fp8_act,
            "memory_gb": round(self.memory_gb, 2), "step_s": round(step.total, 4), "bubble": round(step.bubble, 4),
            "comm_s": round(step.tp_comm + step.cp_comm + step.pp_comm + step.dp_comm, 4),
            "steps": self.steps, "objective_s": round(self.objective_s, 3),
        }


def broken_rule(m, gpus: int, tp: int, cp: int, pp: int) -> str | None:
    """The first shape rule (a REASONS key) that TP/CP/PP break for this model on `gpus` GPUs, or None."""
    if gpus % (tp * cp * pp):
        return "divide"
    if m.heads % tp or m.kv_heads % tp:
        return "heads"
    if m.pipeline_units % pp:
        return "layers"
    if m.seq % (2 * cp if cp > 1 else 1):
        return "seq"
    return None


def candidates(w: Workload, facts: SystemFacts, margin: float, mfu: float | None = None,
               fixed: dict | None = None):
    """Every layout the rules allow, priced: (candidates, rejection counts, layouts priced).

    `fixed` pins some of tp, pp, cp, dp, vpp, ga (e.g. a published layout to check); the rest is searched.
    """
    fixed = fixed or {}
    m = w.model
    gpus = facts.gpus
    limit = facts.gpu_memory_gb * margin * memory.GB
    largest = w.largest_gbs()
    rejected: collections.Counter = collections.Counter()
    out: list[Candidate] = []
    priced = 0
    divs = _divisors(gpus)
    for tp in divs:
        opts = _options(w, tp)
        inner = len(opts) * (1 if w.fixed_gbs else len(GA_CHOICES))
        for cp in divs:
            for pp in divs:
                broken = broken_rule(m, gpus, tp, cp, pp)
                if broken:
                    rejected[broken] += inner
                    continue
                dp = gpus // (tp * cp * pp)
                if any(fixed.get(k, v) != v for k, v in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp))):
                    continue
                per_stage = m.pipeline_units // pp
                vpps = [1] + ([v for v in (2, 4, 8) if per_stage % v == 0] if pp > 1 else [])
                if "vpp" in fixed:
                    vpps = [v for v in vpps if v == fixed["vpp"]]
                for vpp in vpps:
                    for mbs, sp, rc, f8 in opts:
                        gas, bad_div, bad_rcp = _gas(w, mbs, dp, largest)
                        rejected["gbs"] += bad_div
                        rejected["rcp"] += bad_rcp
                        if w.minibs_multiple_of_vpp and vpp > 1:
                            rejected["vpp"] += sum(1 for ga in gas if (mbs * ga) % vpp)
                            gas = [ga for ga in gas if (mbs * ga) % vpp == 0]
                        if "ga" in fixed:
                            gas = [ga for ga in gas if ga == fixed["ga"]]
                        if not gas:
                            continue
                        base = Layout(tp=tp, pp=pp, cp=cp, dp=dp, mbs=mbs, ga=1, sp=sp, recompute=rc, vpp=vpp,
                                      fp8_act=f8)
                        parts = cost.microbatch(w, base, facts, mfu)
                        mem_cache: dict[int, memory.Memory] = {}
                        # Memory depends on GA only through min(PP, GA): within one such class only
                        # the fastest GA can be chosen, so only it becomes a candidate.
                        fastest: dict[int, tuple[float, int, int | None]] = {}
                        for ga in gas:
                            key = min(pp, ga)
                            if key not in mem_cache:
                                mem_cache[key] = memory.estimate(w, dataclasses.replace(base, ga=ga))
                            if tp > facts.nvlink_domain:
                                rejected["nvlink"] += 1
                            elif mem_cache[key].total > limit:
                                rejected["memory"] += 1
                            priced += 1
                            gbs = mbs * ga * dp
                            samples = w.samples_to_converge(gbs)
                            steps = math.ceil(samples / gbs) if samples is not None else None
                            step = parts.step_seconds(ga, pp, vpp)
                            objective = step * steps if steps is not None else step
                            if key not in fastest or objective < fastest[key][0]:
                                fastest[key] = (objective, ga, steps)
                        for key, (_, ga, steps) in fastest.items():
                            out.append(Candidate(base, ga, mem_cache[key], parts, steps))
    if facts.failures is not None:  # the expected failure losses at this scale, on top of the step-time estimate
        for r in out:
            r.objective_s = goodput.time_to_train(facts.failures, w, nodes=facts.nodes, gpus=facts.gpus,
                                                  seconds=r.objective_s, step_s=r.objective_s / (r.steps or 1),
                                                  per_step=r.steps is None)
    return out, rejected, priced


def _pareto(rows: list[Candidate]) -> list[Candidate]:
    """Candidates no other beats (or ties) on memory, objective, TP and simplicity all at once."""
    ordered = sorted(rows, key=lambda r: (r.objective_s, r.memory_gb, r.tp, r.simplicity))
    # First within each (TP, simplicity) class, where only memory is left to compare: O(n).
    lowest: dict[tuple, float] = {}
    reduced = []
    for r in ordered:
        key = (r.tp, r.simplicity)
        if r.memory_gb < lowest.get(key, float("inf")):
            lowest[key] = r.memory_gb
            reduced.append(r)
    front: list[Candidate] = []
    for r in reduced:
        if not any(f.memory_gb <= r.memory_gb and f.tp <= r.tp and f.simplicity <= r.simplicity for f in front):
            front.append(r)
    return front


def select(rows: list[Candidate], limit_gb: float, nvlink_domain: int,
           tolerance: float = DEFAULT_TOLERANCE) -> Candidate | None:
    """The pulp integer program: one layout that fits memory and NVLink, fastest first.

    Lexicographic: the fastest time T*, then among layouts within T* x (1 + tolerance) (the cost
    model's resolution) the simplest one, i.e. the most data parallel, because a model that cannot
    tell two layouts apart should not buy model parallelism or recomputation for nothing.
    """
    pool = _pareto(rows)
    prob = pulp.LpProblem("layout", pulp.LpMinimize)
    x = [prob.add_variable(f"x{i}", cat="Binary") for i in range(len(pool))]
    time_expr = pulp.lpSum(r.objective_s * v for r, v in zip(pool, x))
    prob += pulp.lpSum(x) == 1, "one_layout"
    prob += pulp.lpSum(r.memory_gb * v for r, v in zip(pool, x)) <= limit_gb, "memory"
    prob += pulp.lpSum(r.tp * v for r, v in zip(pool, x)) <= nvlink_domain, "tp_in_nvlink"

    def solve(objective) -> Candidate | None:
        prob.setObjective(objective)
        with warnings.catch_warnings():
            # PuLP 3.3 deprecates the CBC binary it bundles in favour of pulp[cbc]; it still ships it.
            warnings.simplefilter("ignore", DeprecationWarning)
            status = prob.solve(pulp.PULP_CBC_CMD(msg=False, threads=1))
        if pulp.LpStatus[status] != "Optimal":
            return None
        return next((r for r, v in zip(pool, x) if (v.value() or 0) > 0.5), None)

    fastest = solve(time_expr)
    if fastest is None:
        return None
    prob += time_expr <= fastest.objective_s * (1 + tolerance), "near_fastest"
    simplest = solve(pulp.lpSum((r.simplicity + 1e-9 * r.objective_s) * v for r, v in zip(pool, x)))
    return simplest or fastest


def plan(w: Workload, facts: SystemFacts, *, margin: float = DEFAULT_MARGIN, mfu: float | None = None,
         top: int = 10, tolerance: float = DEFAULT_TOLERANCE, fixed: dict | None = None) -> Plan:
    if w.fixed_gbs and w.gbs < 1:
        raise PlanError(f"the global batch must be at least 1 sequence (got {w.gbs})")
    started = time.perf_counter()
    rows, rejected, priced = candidates(w, facts, margin, mfu, fixed)
    limit_gb = facts.gpu_memory_gb * margin
    best = select(rows, limit_gb, facts.nvlink_domain, tolerance) if rows else None
    if best is None:
        raise PlanError(explain_failure(w, facts, margin, rows, rejected))
    feasible = [r for r in rows if r.memory_gb <= limit_gb and r.tp <= facts.nvlink_domain and r is not best]
    feasible.sort(key=lambda r: (r.objective_s, r.memory_gb))
    ranked = [best] + feasible[: top - 1]
    table = pd.DataFrame([r.row() for r in ranked])
    table.insert(0, "rank", range(1, len(table) + 1))
    return Plan(workload=w, facts=facts, margin=margin, best=best, table=table, rejected=rejected,
                evaluated=priced, solve_seconds=time.perf_counter() - started)


def explain_failure(w: Workload, facts: SystemFacts, margin: float, rows: list[Candidate], rejected) -> str:
    m = w.model
    head = f"no layout of {m.name} runs on {facts.gpus} x {facts.gpu} ({facts.name}): "
    counts = "; ".join(f"{REASONS[k]}: {v}" for k, v in (+rejected).most_common())
    if rows:
        smallest = min(rows, key=lambda r: r.memory_gb)
        state = smallest.mem.weights + smallest.mem.grads + smallest.mem.optimizer
        state_all = state * smallest.base.tp * smallest.base.pp / memory.GB
        return (head + f"the smallest predicted memory is {smallest.memory_gb:.1f} GB per GPU "
                f"({smallest.layout.short()}), above {facts.gpu_memory_gb:g} GB x {margin:g} = "
                f"{facts.gpu_memory_gb * margin:.1f} GB. The model has {m.total_params() / 1e9:.1f}B parameters "
                f"whose weights, gradients and optimizer state alone take {state_all:,.0f} GB per replica, "
                f"{state / memory.GB:.1f} GB per GPU here; it needs more GPUs (for TP/PP/CP) or more memory per GPU. "
                "Rejected layouts by reason: " + counts)
    if w.fixed_gbs and rejected.get("gbs"):
        divs = _divisors(facts.gpus)
        dps = sorted({facts.gpus // (tp * cp * pp) for tp in divs for cp in divs for pp in divs
                      if facts.gpus % (tp * cp * pp) == 0 and m.pipeline_units % pp == 0
                      and m.heads % tp == 0 and m.kv_heads % tp == 0 and m.seq % (2 * cp if cp > 1 else 1) == 0})
        return (head + f"the global batch {w.gbs} is not a multiple of MBS x DP for any layout: the rules leave "
                f"DP in {{{', '.join(map(str, dps))}}} and MBS in {{{', '.join(map(str, w.mbs_choices))}}}, so the "
                f"GBS must be a multiple of {dps[0]} (the nearest: "
                f"{' or '.join(str(g) for g in (w.gbs - w.gbs % dps[0], w.gbs - w.gbs % dps[0] + dps[0]) if g)}). "
                "Rejected layouts by reason: " + counts)
    return head + "every layout breaks a rule. Rejected layouts by reason: " + counts
