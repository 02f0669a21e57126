"""Check a run's training-loss curve against a benchmark's reference curve and band, and plot it.

The NeMo guide uses the loss curve as a hardware-health signal: for one config the curve is
deterministic, so a run that leaves the reference band points at a machine, not at the model.
A reference is a CSV of `iteration,loss` with either `lower,upper` columns or one relative
tolerance for all points; the reference is interpolated at the run's logged iterations
(only inside the reference's range), and the first step outside the band is named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from mlrepro.scoring.plots import plt
from mlrepro.util.fsutil import atomic_path


class ReferenceError(ValueError):
    """The reference curve file is unusable."""


@dataclasses.dataclass(frozen=True)
class Band:
    iteration: np.ndarray
    loss: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


@dataclasses.dataclass(frozen=True)
class BandCheck:
    inside: bool
    first_step: int | None  # the first logged iteration outside the band
    loss: float | None
    lower: float | None
    upper: float | None
    outside: int  # logged points outside
    checked: int  # logged points inside the reference's range

    def message(self) -> str:
        if self.checked == 0:
            return "no logged iteration falls inside the reference curve's range"
        if self.inside:
            return f"loss stays inside the reference band at all {self.checked} checked steps"
        return (f"loss leaves the reference band at step {self.first_step}: {self.loss:.4g} outside "
                f"[{self.lower:.4g}, {self.upper:.4g}] ({self.outside} of {self.checked} checked steps outside)")


def load_reference(path: str | Path, tolerance: float | None = None) -> Band:
    path = Path(path)
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ReferenceError(f"{path}: cannot read the reference curve: {exc}") from exc
    if not {"iteration", "loss"} <= set(df.columns):
        raise ReferenceError(f"{path}: needs columns iteration,loss (has {', '.join(df.columns)})")
    df = df.sort_values("iteration")
    loss = df["loss"].to_numpy(float)
    if {"lower", "upper"} <= set(df.columns):
        lower, upper = df["lower"].to_numpy(float), df["upper"].to_numpy(float)
    elif tolerance is not None:
        lower, upper = loss * (1 - tolerance), loss * (1 + tolerance)
    else:
        raise ReferenceError(f"{path}: no lower,upper columns and no tolerance given")
    if not np.all(np.isfinite(np.c_[loss, lower, upper])) or np.any(lower > upper):
        raise ReferenceError(f"{path}: band values must be finite with lower <= upper")
    return Band(df["iteration"].to_numpy(float), loss, lower, upper)


def check(curve: list[list[float]], band: Band) -> BandCheck:
    """curve: [[iteration, loss], ...] as the run record holds it."""
    pts = [(int(i), float(v)) for i, v in curve if band.iteration[0] <= i <= band.iteration[-1]]
    first, outside = None, 0
    for it, loss in pts:
        lo = float(np.interp(it, band.iteration, band.lower))
        hi = float(np.interp(it, band.iteration, band.upper))
        if not lo <= loss <= hi:
            outside += 1
            first = first or (it, loss, lo, hi)
    if first is None:
        return BandCheck(True, None, None, None, None, 0, len(pts))
    return BandCheck(False, first[0], first[1], first[2], first[3], outside, len(pts))


def plot(curve: list[list[float]], band: Band, result: BandCheck, out: str | Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(band.iteration, band.lower, band.upper, color="tab:green", alpha=0.2, label="reference band")
    ax.plot(band.iteration, band.loss, color="tab:green", lw=1, label="reference")
    xs, ys = zip(*curve) if curve else ((), ())
    ax.plot(xs, ys, color="tab:blue", lw=1.2, label="this run")
    if not result.inside and result.first_step is not None:
        ax.axvline(result.first_step, color="tab:red", ls="--", lw=1)
        ax.annotate(f"leaves band at step {result.first_step}", (result.first_step, result.loss),
                    color="tab:red", textcoords="offset points", xytext=(5, 10))
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title(title or "training loss vs reference")
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=out.suffix.lstrip(".") or "png")
    plt.close(fig)
    return out
