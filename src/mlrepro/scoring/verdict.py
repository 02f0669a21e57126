"""Was the result reproduced? Your scored runs against the reference's, with a stated test.

The score difference is reported in %, and whether it is within what the runs' own spread
explains is decided by two-sided Mann-Whitney U tests (scipy.stats.mannwhitneyu, alpha 0.05)
on the two sets of per-run values:

* time to train per run (minutes), the number the score is made of;
* time per sample (minutes / samples to converge). Time to train is samples to converge times
  time per sample, and the samples vary from seed to seed by the nature of convergence
  (llama2_70b_lora's published runs range 2688-3840 samples, 9.5-13.9 min), which hides a
  machine that is 10% slower from the first test at ten runs a side (p = 0.12). Per sample,
  those runs agree within 3.2% (coefficient of variation 1.2%), so a slower machine shows;
* samples to converge, the convergence itself (and the RCP factor beside it).

Reproduced means: your score is valid and none of the three tests finds a difference larger than
the tolerance (TOLERANCE_PCT, 5%, between the olympic means). A significance test alone calls a
machine 3% slower "not reproduced" as soon as the runs are steady enough (mini_lora's per-sample
times vary by about 1%; a shared VM drifts by 3% between two runs minutes apart), which no engineer
calls a failed reproduction; a difference within the tolerance is reported with its p-value.
Mann-Whitney makes no normality assumption and ten runs a side is what it needs to detect
a shift at alpha 0.05 (no overlap of the two sets gives p = 0.00018).

Without a reference (a miniature that ships no reference runs) the seeds are compared with
each other only: their spread and each seed's distance from the median.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from mlrepro.scoring import page
from mlrepro.scoring.records import ABSENT, ScoreRecord, VerdictRecord

ALPHA = 0.05
TOLERANCE_PCT = 5.0
METHOD = ("two-sided Mann-Whitney U test (scipy.stats.mannwhitneyu) on the per-run values of your counted runs "
          f"against the reference's, alpha {ALPHA}; a difference of the olympic means within "
          f"{TOLERANCE_PCT:g}% is a reproduction")
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_VALID = "not valid"
NO_REFERENCE = "seeds only"


def _counted(score: dict | None) -> list[dict]:
    return [r for r in (score or {}).get("runs") or [] if r.get("counted") and r.get("minutes") is not None]


def _values(score: dict | None, what: str) -> list[float]:
    runs = _counted(score)
    if what == "minutes":
        return [r["minutes"] for r in runs]
    if what == "samples":
        return [r["samples_to_converge"] for r in runs if r.get("samples_to_converge")]
    return [r["minutes"] / r["samples_to_converge"] * 1000 for r in runs if r.get("samples_to_converge")]


def _pct(yours: float | None, theirs: float | None) -> float | None:
    if yours is None or theirs is None or theirs == 0:
        return None
    return (yours - theirs) / theirs * 100


def olympic(values: Sequence[float]) -> float | None:
    """Mean without the fastest and the slowest (the plain mean below three values)."""
    v = sorted(values)
    if not v:
        return None
    return statistics.fmean(v[1:-1] if len(v) >= 3 else v)


def mann_whitney(yours: Sequence[float], theirs: Sequence[float]) -> dict:
    """The test on two sets of per-run values: {p, statistic, n_yours, n_theirs, difference_pct, note}."""
    out: dict[str, Any] = {"n_yours": len(yours), "n_theirs": len(theirs), "p": None, "statistic": None,
                           "difference_pct": _pct(olympic(yours), olympic(theirs)),
                           "yours": olympic(yours), "theirs": olympic(theirs)}
    if len(yours) < 2 or len(theirs) < 2:
        out["note"] = "too few runs to test (needs two a side)"
        return out
    from scipy.stats import mannwhitneyu

    result = mannwhitneyu(yours, theirs, alternative="two-sided")
    p = float(result.pvalue)
    # Every value equal on both sides: nothing to tell apart.
    out["p"] = 1.0 if math.isnan(p) else p
    out["statistic"] = float(result.statistic)
    out["beyond_spread"] = out["p"] < ALPHA
    out["different"] = out["beyond_spread"] and not within_tolerance(out["difference_pct"])
    return out


def within_tolerance(difference_pct: float | None) -> bool:
    """A difference of the olympic means small enough to be a reproduction whatever the test says."""
    return difference_pct is not None and abs(difference_pct) <= TOLERANCE_PCT


def seed_spread(score: dict | None) -> dict:
    """How the seeds of one set of runs compare with each other."""
    runs = _counted(score)
    minutes = [r["minutes"] for r in runs]
    if not minutes:
        return {"runs": 0, "median": None, "cv_pct": None, "range_pct": None, "seeds": []}
    median = statistics.median(minutes)
    cv = statistics.stdev(minutes) / statistics.fmean(minutes) * 100 if len(minutes) > 1 else 0.0
    return {
        "runs": len(minutes),
        "median": median,
        "cv_pct": cv,
        "range_pct": (max(minutes) - min(minutes)) / median * 100,
        "seeds": [{"seed": r.get("seed"), "minutes": r["minutes"], "from_median_pct": _pct(r["minutes"], median)}
                  for r in runs],
    }


def compare(yours: dict, reference: dict, *, benchmark: str | None = None, system: dict | None = None,
            environment: dict | None = None) -> dict:
    """The verdict of one benchmark on one system (verdict.json).

    `yours` is the benchmark's score.json, `reference` its reference.json (see
    mlrepro.scoring.reference), `benchmark` its configured name (default: the score's),
    `system` what the user ran on, `environment` the user's
    container.json (and preflight, when there is one).
    """
    theirs = reference.get("score")
    out: dict[str, Any] = {
        "benchmark": benchmark or yours["benchmark"],
        "mlperf_benchmark": yours.get("mlperf_benchmark"),
        "system": system or {},
        "reference": {k: v for k, v in reference.items() if k != "score"},
        "method": METHOD,
        "alpha": ALPHA,
        "valid": bool(yours.get("valid")),
        "reasons": list(yours.get("reasons") or []),
        "score_minutes": yours.get("score_minutes"),
        "reference_score_minutes": (theirs or {}).get("score_minutes"),
        "reference_valid": (theirs or {}).get("valid"),
        "difference_pct": _pct(yours.get("score_minutes"), (theirs or {}).get("score_minutes")),
        "rcp_factor": (yours.get("rcp") or {}).get("scaling_factor"),
        "reference_rcp_factor": ((theirs or {}).get("rcp") or {}).get("scaling_factor"),
        "seeds": seed_spread(yours),
        "reference_seeds": seed_spread(theirs),
        "runs": {"yours": _values(yours, "minutes"), "theirs": _values(theirs, "minutes"),
                 "yours_per_ksample": _values(yours, "speed"), "theirs_per_ksample": _values(theirs, "speed")},
        "environment": environment or {},
        "tests": {},
    }
    out["rcp_factor_difference_pct"] = _pct(out["rcp_factor"], out["reference_rcp_factor"])
    if theirs is None:
        out["verdict"] = NO_REFERENCE if out["valid"] else NOT_VALID
        out["why"] = [reference["match"]["because"]] + out["reasons"]
        return out
    tests = {
        "time_to_train": mann_whitney(_values(yours, "minutes"), _values(theirs, "minutes")),
        "time_per_sample": mann_whitney(_values(yours, "speed"), _values(theirs, "speed")),
        "samples_to_converge": mann_whitney(_values(yours, "samples"), _values(theirs, "samples")),
    }
    out["tests"] = tests
    why = []
    labels = {"time_to_train": "time to train", "time_per_sample": "time per sample",
              "samples_to_converge": "samples to converge"}
    for key, test in tests.items():
        if test.get("different"):
            way = "higher" if (test["difference_pct"] or 0) > 0 else "lower"
            why.append(f"{labels[key]} {abs(test['difference_pct']):.1f}% {way} than the reference's, beyond its "
                       f"runs' spread (p {p_shown(test['p'])})")
    if not out["valid"]:
        out["verdict"] = NOT_VALID
        why = out["reasons"] + why
    else:
        out["verdict"] = NOT_REPRODUCED if why else REPRODUCED
        if not why and out["difference_pct"] is None:  # a reference with runs but no score of its own
            why = ["no test finds a difference; the reference has no score to state one in %"]
        elif not why:
            steady = [labels[k] for k, t in tests.items() if t.get("beyond_spread")]
            why = [f"difference {out['difference_pct']:+.1f}% is within what the runs' spread explains"
                   if not steady else
                   f"difference {out['difference_pct']:+.1f}%: {', '.join(steady)} beyond the runs' spread but "
                   f"within the {TOLERANCE_PCT:g}% tolerance"]
    out["why"] = why
    return out


def reproduction_verdict(score: ScoreRecord, reference_file: Path, container_file: Path, preflight_file: Path | None,
                         *, benchmark: str, system: dict, config: dict | None) -> VerdictRecord:
    """A reproduction's verdict.json: `compare` of its score with its reference.json, in the environment
    its container.json and preflight record describe, with the implementation config its runs used
    and what its score carries (cost, running verdict, early stop, effective training time)."""
    environment = {"container": json.loads(Path(container_file).read_text()),
                   "preflight": json.loads(Path(preflight_file).read_text()) if preflight_file else None}
    found = VerdictRecord.from_json(compare(score.to_json(), json.loads(Path(reference_file).read_text()),
                                            benchmark=benchmark, system=system, environment=environment))
    carried = {key: getattr(score, key) for key in ("cost", "early_stop", "running_verdict", "complete_mlperf_result",
                                                       "goodput")
               if getattr(score, key) is not ABSENT}
    if score.early_stop is not ABSENT:
        # Settled before all its seeds ran: the early stop's own verdict, not the score's "not valid".
        message = score.early_stop["message"]
        carried.update(verdict=NOT_REPRODUCED, why=[message] + [w for w in found.why if w != message])
    return found.replace(config=config, **carried)


def p_shown(p: float) -> str:
    """'< 0.001' or '= 0.02': how the why of a verdict quotes a p-value."""
    shown = page.p_value(p)
    return shown if shown.startswith("<") else f"= {shown}"
