"""The cost model calibrated on the node: its few free constants fitted on the system's measured steps.

What is measured goes into the model as it is (mlrepro.plan.hardware: the GEMM sweep's rate at each
GEMM shape, the all_reduce bus bandwidth by message size, the copy rate). What no single
measurement gives is fitted on whole training steps of the same system (`cost.Tuning`):

- compute_scale: the share of the sweep's GEMM rate (else of peak x MFU) a training step's GEMMs reach;
- chunk_overhead_s: the pipeline's cost per micro-batch per virtual stage (p2p waits, launches);
- elementwise_passes: memory-bound passes per layer and micro-batch (norms, residuals, GeLU, dropout),
  which TP without sequence parallelism repeats on every rank;
- step_overhead_s: a fixed cost per step (what the terms miss: synchronisation, launches);
- launch_per_layer_s: the host's time to launch one layer's kernels of a micro-batch (forward and
  backward), which the GPU's work hides only when it is longer: what makes a micro-batch of 1 cost
  nearly what one of 4 costs on a small model.

A constant is fitted only where the rows can tell it apart (PP rows for the pipeline's, TP rows or
traced rows of two models for the memory-bound one, five figures or more for the fixed one; never more
constants than figures less one); the rest keep their defaults, and the plan names them. The fit
minimises the squared log error of the predicted step times and, for a row traced by the baseline's
profile (`baseline: megatron: profile: true`), of the GPU's busy time in its trace: that tells the
GPU's constants (compute scale, element-wise passes) from the host's (launches, the fixed cost), which
step times alone leave to trade against each other (scipy's bounded least squares).

The rows: the baseline stage's Megatron-LM runs (results/baseline/<system>/baseline.json, workload
"megatron") and every finished seed or trial of the system (results/plan/<system>/observed.json,
`observe`). The result, results/plan/<system>/calibration.json, holds the constants, the rows with
their predictions before and after, and each row's leave-one-out error (fitted on the others), so
the figure that says how good the model is was not fitted on the row it judges.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from scipy import optimize

from mlrepro import paths
from mlrepro.plan import cost, hardware, models, workloads
from mlrepro.plan.layout import Layout
from mlrepro.util.fsutil import atomic_write_json

# Starting points and bounds of the fit (seconds, passes); the starting points are not defaults.
START = {"compute_scale": None, "chunk_overhead_s": 1e-3, "elementwise_passes": 20.0, "step_overhead_s": 5e-3,
         "launch_per_layer_s": 1e-3}
BOUNDS = {"compute_scale": (0.05, 3.0), "chunk_overhead_s": (0.0, 0.1), "elementwise_passes": (0.0, 1000.0),
          "step_overhead_s": (0.0, 2.0), "launch_per_layer_s": (0.0, 0.05)}
OBSERVED_KEEP = 200  # the newest observations kept per system


@dataclasses.dataclass(frozen=True)
class Observation:
    """One measured step: a GPT size, its layout, the measured seconds per iteration, and where from."""

    model: str
    layout: Layout
    measured_s: float
    source: str
    attention: str = "sdpa"
    predicted_s: float | None = None  # what the plan predicted when it ran (a seed's, a trial's)
    gpu_busy_s: float | None = None  # the GPU's busy time per step in a profiler trace (baseline: profile)

    def label(self) -> str:
        lay = self.layout
        return (f"{self.model} TP{lay.tp} PP{lay.pp} DP{lay.dp}" + (f" VPP{lay.vpp}" if lay.vpp > 1 else "")
                + f" MBS{lay.mbs} GBS{lay.gbs}")

    def to_json(self) -> dict:
        lay = self.layout
        return {"model": self.model, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "vpp": lay.vpp, "mbs": lay.mbs,
                "gbs": lay.gbs, "measured_s": self.measured_s, "predicted_s": self.predicted_s,
                "attention": self.attention, "source": self.source, "gpu_busy_s": self.gpu_busy_s}

    @classmethod
    def from_row(cls, row: dict, source: str) -> "Observation | None":
        """A baseline.json run or an observed.json entry; None for a row without a measured step."""
        try:
            tp, pp, dp, mbs, gbs = (int(row.get(k) or 1) for k in ("tp", "pp", "dp", "mbs", "gbs"))
            measured = float(row.get("iter_time_s") or row.get("measured_s") or 0)
            vpp = int(row.get("vpp") or 1)
            model = str(row["model"])
        except (KeyError, TypeError, ValueError):
            return None
        if measured <= 0 or row.get("error") or gbs % (mbs * dp):
            return None
        predicted = row.get("predicted_s") or row.get("predicted_iter_time_s")
        lay = Layout(tp=tp, pp=pp, dp=dp, vpp=vpp, mbs=mbs, ga=gbs // (mbs * dp))
        return cls(model=model, layout=lay, measured_s=measured, source=source,
                   attention=str(row.get("attention") or "sdpa"),
                   predicted_s=float(predicted) if predicted else None, gpu_busy_s=busy_of(row))


def busy_of(row: dict) -> float | None:
    """The GPU's busy seconds per step a row measured: rank 0's profiler trace (baseline: megatron: profile),
    or an observed.json row's own figure; None without one."""
    profile = row.get("profile")
    figure = (profile.get("rank0") or {}).get("gpu_busy_s") if isinstance(profile, dict) else row.get("gpu_busy_s")
    try:
        busy = float(figure) if figure is not None else None
    except (TypeError, ValueError):
        return None
    return busy if busy is not None and 0 < busy < float("inf") else None


def baseline_observations(baseline: dict | None, source: str = "baseline.json") -> list[Observation]:
    """The baseline stage's Megatron-LM runs that measured a step (the probe is not Megatron: not a row)."""
    rows = [r for r in (baseline or {}).get("runs") or [] if isinstance(r, dict) and r.get("workload") == "megatron"]
    out = []
    for i, r in enumerate(rows):
        obs = Observation.from_row(r, f"{source}#{i}")
        if obs is not None and obs.model in models.MODELS:
            out.append(obs)
    return out


def observed(root: Path, system: str) -> list[Observation]:
    """results/plan/<system>/observed.json's rows (finished seeds and trials)."""
    record = paths.read_json_if_exists(paths.observed_json(root, system)) or {}
    return [o for r in record.get("rows") or [] if isinstance(r, dict)
            and (o := Observation.from_row(r, str(r.get("source") or "observed.json"))) is not None]


def all_observations(root: Path, system: str) -> list[Observation]:
    base = paths.read_json_if_exists(paths.baseline_json(root, system))
    return baseline_observations(base, str(paths.baseline_json(Path(), system))) + observed(root, system)


def step(obs: Observation, facts: hardware.SystemFacts) -> cost.StepTime:
    """The cost model's step for the observation's layout on these facts."""
    w = workloads.gpt(obs.model, obs.layout.gbs, flash_attention=obs.attention == "sdpa")
    return cost.estimate(w, obs.layout, facts.with_gpus(obs.layout.gpus))


def predict(obs: Observation, facts: hardware.SystemFacts) -> float:
    """The cost model's step time for the observation's layout on these facts."""
    return step(obs, facts).total


def free_constants(rows: list[Observation]) -> list[str]:
    """The constants these rows can tell apart, most telling first, at most one fewer than the figures
    (a step time per row, and a traced row's GPU busy time)."""
    figures = len(rows) + sum(1 for o in rows if o.gpu_busy_s)
    keys = ["compute_scale"]
    if any(o.layout.pp > 1 for o in rows) and any(o.layout.pp == 1 for o in rows):
        keys.append("chunk_overhead_s")
    if len({o.layout.mbs for o in rows}) > 1:
        keys.append("launch_per_layer_s")
    # TP rows repeat the element-wise work on every rank; a trace measures the GPU's share directly.
    if (any(o.layout.tp > 1 for o in rows) and any(o.layout.tp == 1 for o in rows)) \
            or len({o.model for o in rows if o.gpu_busy_s}) > 1:
        keys.append("elementwise_passes")
    if figures >= 5:
        keys.append("step_overhead_s")
    return keys[:max(1, figures - 1)]


def _tuning(keys: list[str], x, source: str, basis: str) -> cost.Tuning:
    return cost.Tuning(**{k: float(v) for k, v in zip(keys, x)}, source=source, basis=basis)


def fit(rows: list[Observation], facts: hardware.SystemFacts, source: str = "fitted") -> cost.Tuning:
    """The constants that best predict `rows` (bounded least squares on log(predicted / measured))."""
    if not rows:
        raise ValueError("no measured steps to calibrate on")
    facts = facts.with_tuning(None)
    basis = hardware.basis(facts)
    keys = free_constants(rows)
    # Start from the default compute scale: in the sweep's basis that is the step/matmul share.
    _, default_scale, _ = cost.rates(facts)
    x0 = [default_scale if k == "compute_scale" else START[k] for k in keys]
    lo, hi = zip(*(BOUNDS[k] for k in keys))
    measured = np.array([o.measured_s for o in rows])
    traced = [i for i, o in enumerate(rows) if o.gpu_busy_s]
    busy = np.array([rows[i].gpu_busy_s for i in traced])

    def residuals(x):
        # A traced row is fitted twice: its step time, and the GPU's share of it, which tells the GPU's terms
        # (compute scale, element-wise passes) from the host's (launches, the step's fixed cost).
        tuned = facts.with_tuning(_tuning(keys, x, source, basis))
        steps = [step(o, tuned) for o in rows]
        totals = np.log(np.array([s.total for s in steps]) / measured)
        if not traced:
            return totals
        return np.concatenate([totals, np.log(np.array([steps[i].gpu_busy for i in traced]) / busy)])

    x0 = np.clip(x0, lo, hi)
    result = optimize.least_squares(residuals, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), 1e-3))
    return _tuning(keys, result.x, source, basis)


def error_pct(predicted: float, measured: float) -> float:
    return round(100 * (predicted - measured) / measured, 1)


def leave_one_out(rows: list[Observation], facts: hardware.SystemFacts) -> list[float | None]:
    """Each row's error (%) predicted by the constants fitted on the other rows (None with one row)."""
    out = []
    for i, o in enumerate(rows):
        others = rows[:i] + rows[i + 1:]
        if not others:
            out.append(None)
            continue
        tuned = facts.with_tuning(fit(others, facts, source="leave-one-out"))
        out.append(error_pct(predict(o, tuned), o.measured_s))
    return out


def calibrate(rows: list[Observation], facts: hardware.SystemFacts, source: str) -> dict:
    """calibration.json's record: the fitted constants, and every row predicted before and after, with
    its leave-one-out error."""
    facts = facts.with_tuning(None)
    tuning = fit(rows, facts, source=f"fitted on {len(rows)} measured steps ({source})")
    tuned = facts.with_tuning(tuning)
    loo = leave_one_out(rows, facts)
    table = []
    for o, held_out in zip(rows, loo):
        before, after = predict(o, facts), step(o, tuned)
        table.append({"row": o.label(), "source": o.source, "measured_s": round(o.measured_s, 4),
                      "before_s": round(before, 4), "before_error_pct": error_pct(before, o.measured_s),
                      "after_s": round(after.total, 4), "after_error_pct": error_pct(after.total, o.measured_s),
                      "leave_one_out_error_pct": held_out,
                      "gpu_busy_s": o.gpu_busy_s and round(o.gpu_busy_s, 4),
                      "gpu_busy_after_s": round(after.gpu_busy, 4) if o.gpu_busy_s else None})
    return {"system": facts.name, "basis": hardware.basis(facts), "tuning": tuning.to_json(),
            "free": free_constants(rows), "rows": table,
            "max_abs_error_pct": {k: max((abs(r[k]) for r in table if r[k] is not None), default=None)
                                  for k in ("before_error_pct", "after_error_pct", "leave_one_out_error_pct")}}


def calibrate_system(root: Path, system: str) -> dict | None:
    """Fit the system's constants on its baseline rows and observations, and write calibration.json
    (None, and nothing written, when no step of the system was measured)."""
    root = Path(root)
    rows = all_observations(root, system)
    if not rows:
        return None
    facts = hardware.load(root, system).with_tuning(None)
    record = calibrate(rows, facts, source=f"{paths.baseline_json(Path(), system)}, "
                                           f"{paths.observed_json(Path(), system)}")
    atomic_write_json(paths.calibration_json(root, system), record)
    return record


def observe(root: Path, system: str, obs: Observation, *, refit: bool = True) -> dict | None:
    """Keep a finished run's measured step beside its prediction (observed.json) and fit the system's
    constants again, so that the next plan starts from it. Returns the new calibration record."""
    where = paths.observed_json(root, system)
    record = paths.read_json_if_exists(where) or {}
    rows = [r for r in record.get("rows") or [] if isinstance(r, dict) and r.get("source") != obs.source]
    rows.append(obs.to_json())
    atomic_write_json(where, {"system": system, "rows": rows[-OBSERVED_KEEP:]})
    return calibrate_system(root, system) if refit else None


def table_markdown(record: dict) -> str:
    """The calibration's rows as a Markdown table (docs/measurements/planner/, the benchmark's output)."""
    traced = any(r.get("gpu_busy_s") for r in record["rows"])
    lines = ["| layout | measured s | before s | error | after s | error | leave-one-out error |"
             + (" GPU busy s (trace) | after |" if traced else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if traced else "")]
    for r in record["rows"]:
        loo = r["leave_one_out_error_pct"]
        busy = r.get("gpu_busy_s")
        lines.append(f"| {r['row']} | {r['measured_s']:.3f} | {r['before_s']:.3f} | {r['before_error_pct']:+.1f}% | "
                     f"{r['after_s']:.3f} | {r['after_error_pct']:+.1f}% | "
                     + ("n/a" if loo is None else f"{loo:+.1f}%") + " |"
                     + ((f" {busy:.3f} | {r['gpu_busy_after_s']:.3f} |" if busy else " - | - |") if traced else ""))
    t = record["tuning"]
    lines.append("")
    lines.append("constants: " + ", ".join(f"{k} = {t[k]:.4g}" for k in cost.Tuning.DEFAULTS
                                           if t.get(k) is not None)
                 + f" (basis: {record['basis']}; the others at their defaults)")
    return "\n".join(lines)
