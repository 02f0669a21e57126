"""A seed that has already lost: its evaluation metric outside the reference runs' band at the same point.

The point is the work done so far: samples (MLLOG eval_accuracy's metadata.samples_count) or
tokens (a Megatron run's validation loss, at iteration x global batch x sequence length), so seeds
of different speed are compared where they have seen the same data. At each point of the seed's
curve the reference runs' curves are interpolated (each only inside its own range), and the band is
their minimum to maximum, widened by `margin` of its value on each side; a point where fewer than
`min_runs` reference runs reach is not judged (converged reference runs stop logging early).

A seed has lost when `patience` judged points in a row lie on the worse side of the band (above it
for a loss). The better side is reported, never held against the seed. The NeMo guide reads the same
signal from a deterministic loss curve to spot bad hardware.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

Curve = Sequence[Sequence[float]]  # [[samples or tokens, value], ...], as run.json's "evals"

MARGIN = 0.02
PATIENCE = 2
MIN_RUNS = 2


@dataclass(frozen=True)
class BandCheck:
    lost: bool
    checked: int  # points of the seed's curve with a band to compare with
    worse: int  # of those, points on the worse side
    better: int  # of those, points on the better side
    first_at: float | None = None  # the first point of the run of `patience` worse ones
    value: float | None = None
    lower: float | None = None
    upper: float | None = None

    def message(self, what: str = "samples") -> str:
        if not self.checked:
            return "no evaluation yet where the reference runs have one"
        if not self.lost:
            return f"inside the reference band (or better) at {self.checked} evaluations"
        return (f"outside the reference band since {self.first_at:g} {what}: {self.value:.4g} not in "
                f"[{self.lower:.4g}, {self.upper:.4g}]")

    def to_dict(self) -> dict:
        return asdict(self)


def value_at(curve: Curve, x: float) -> float | None:
    """The curve's value at x by linear interpolation, None outside its range."""
    pts = sorted((float(a), float(b)) for a, b in curve if a is not None and b is not None)
    if not pts or not pts[0][0] <= x <= pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1]


def band_at(x: float, reference: Sequence[Curve], margin: float = MARGIN,
            min_runs: int = MIN_RUNS) -> tuple[float, float] | None:
    """(lower, upper) of the reference runs at x, widened by `margin`; None where too few reach x."""
    values = [v for v in (value_at(c, x) for c in reference) if v is not None]
    if len(values) < min_runs:
        return None
    lo, hi = min(values), max(values)
    return lo - margin * abs(lo), hi + margin * abs(hi)


def check(curve: Curve, reference: Sequence[Curve], *, lower_is_better: bool = True, margin: float = MARGIN,
          patience: int = PATIENCE, min_runs: int = MIN_RUNS) -> BandCheck:
    """Has the seed with this curve already lost against the reference runs' curves?"""
    if patience < 1:
        raise ValueError(f"patience must be at least 1 (got {patience})")
    checked = worse = better = streak = 0
    first = None
    for x, value in sorted((float(a), float(b)) for a, b in curve if a is not None and b is not None):
        band = band_at(x, reference, margin, min_runs)
        if band is None:
            continue
        checked += 1
        lo, hi = band
        is_worse = value > hi if lower_is_better else value < lo
        is_better = value < lo if lower_is_better else value > hi
        better += is_better
        if not is_worse:
            streak, first = 0, None
            continue
        worse += 1
        streak += 1
        first = first or (x, value, lo, hi)
        if streak >= patience:
            return BandCheck(True, checked, worse, better, *first)
    return BandCheck(False, checked, worse, better)


def reference_curves(score_runs: Sequence[dict]) -> list[list[list[float]]]:
    """The evals of the reference's counted runs (run.json records), the band's input."""
    return [[list(p) for p in r.get("evals") or [] if p and p[0] is not None]
            for r in score_runs if r.get("counted") and r.get("evals")]
