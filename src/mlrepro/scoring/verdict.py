"""Was the result reproduced? Your scored runs against the reference's, with a stated method and its power.

Three quantities are compared per run (`QUANTITIES`):

* time to train (minutes), the number the score is made of;
* time per sample (minutes / samples to converge): the machine's speed. Time to train is samples to
  converge times time per sample, and the samples vary from seed to seed by the nature of convergence
  (llama2_70b_lora's published runs range 2688-3840 samples, 9.5-13.9 min), while per sample the runs
  of one published system agree within 0.2-1.8% (standard deviation of the logs). That steadiness is
  what lets a few runs tell a slower machine apart;
* samples to converge, the convergence itself (and the RCP factor beside it).

The method (`assess`, the one judge of the final verdict, the running verdict and the early stop):
for each quantity, the ratio of your runs' geometric mean to the reference's, with its interval from
the pooled spread of the logs of both sets (Student's t with n_yours + n_reference - 2 degrees of
freedom). Spread is pooled because three runs of yours alone hold two degrees of freedom; the
reference's runs tell how much runs of this benchmark vary. The intervals of the m quantities judged
hold together with probability 1 - ALPHA (95%; each at 1 - ALPHA / m, Bonferroni). Each is read against
the tolerance band, 1 -/+ TOLERANCE_PCT (5%): inside it, the quantity is *within* the tolerance (two
one-sided tests, TOST); wholly outside, *beyond* it; otherwise *undecided*. The verdict:

* `not reproduced`: some quantity is beyond the tolerance;
* `reproduced`: none is, and the machine's speed (time per sample; time to train where runs log no
  samples) is within it;
* `inconclusive` ("too few runs to tell"): neither. A Mann-Whitney test of 3 runs against 3 can never
  find a difference at alpha 0.05 (its smallest p is 0.10), and an absence of evidence used to read
  "reproduced"; now a verdict needs evidence either way. A reproduction within the tolerance is
  called "not reproduced" only when some interval misses its true ratio, so with probability at most
  ALPHA; one slower than the tolerance is called "reproduced" with probability at most ALPHA / (2 m).
  (Intervals at 90% each, the textbook TOST, called 10% of exact reproductions of the miniatures,
  whose runs vary 31% and more, "not reproduced": with a spread that wide the band is a point.)

How much the runs can tell is stated with the verdict (`power`): the smallest slowdown that these
run counts and this spread call "not reproduced" with probability POWER (80%), and the probability
that an exact reproduction would be called "reproduced". benchmarks/verdict_power.py measures how
often each verdict is given over the published systems (docs/measurements/verdict/).

Without a reference (a miniature that ships no reference runs) the seeds are compared with
each other only: their spread and each seed's distance from the median.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mlrepro.scoring import page
from mlrepro.scoring.records import ABSENT, ScoreRecord, VerdictRecord

ALPHA = 0.05
CONFIDENCE = 1 - ALPHA  # of the intervals of all the quantities judged, together
TOLERANCE_PCT = 5.0
POWER = 0.8
METHOD = (f"ratio of the geometric means of your counted runs and the reference's, per quantity, with its "
          "interval from the pooled spread of the logs (Student's t; the intervals of the quantities judged hold "
          f"together with {CONFIDENCE:.0%} confidence, Bonferroni); an interval within 1 -/+ {TOLERANCE_PCT:g}% "
          "is a reproduction (two one-sided tests), wholly outside it a difference; time per sample decides "
          "reproduced, any quantity beyond the tolerance not reproduced, and otherwise there are too few runs "
          "to tell")
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
TOO_FEW = "too few runs to tell"
NOT_VALID = "not valid"
NO_REFERENCE = "seeds only"
# assess's verdict codes, in this order
VERDICTS = (REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)
# a quantity's interval against the tolerance band, in this order
WITHIN, UNDECIDED, BEYOND = "within", "undecided", "beyond"
OUTCOMES = (WITHIN, UNDECIDED, BEYOND)
# the per-run columns assess reads, in this order (time to train alone where runs log no samples)
QUANTITIES = ("time_to_train", "time_per_sample", "samples_to_converge")
LABELS = {"time_to_train": "time to train", "time_per_sample": "time per sample",
          "samples_to_converge": "samples to converge"}
# A spread of the logs below this is none: identical runs (copies, or every run converging at the same
# evaluation) would otherwise give an interval made of rounding error.
_NO_SPREAD = 1e-12


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


def _band() -> tuple[float, float]:
    """The tolerance band in logs: a ratio from 1 - tolerance to 1 + tolerance."""
    return math.log(1 - TOLERANCE_PCT / 100), math.log(1 + TOLERANCE_PCT / 100)


def each_confidence(quantities: int) -> float:
    """The confidence of each of `quantities` intervals that hold together with CONFIDENCE (Bonferroni)."""
    return 1 - ALPHA / quantities


def ratio_interval(yours: np.ndarray, theirs: np.ndarray, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Your runs' geometric mean over the reference's, with its two-sided `confidence` interval, for each row.

    `yours` is (..., n1) positive per-run values, `theirs` (n2,). The interval is the pooled two-sample
    t interval of the difference of the logs' means (scipy.stats.ttest_ind's, computed here for all rows
    at once: the simulation of the running verdict asks it of thousands of sets per look). Returns
    {"ratio", "low", "high", "p"} (arrays over the rows: ratios, and the two-sided p of equal means),
    "sd" (the pooled standard deviation of the logs) and "df".
    """
    a, b = np.log(np.asarray(yours, float)), np.log(np.asarray(theirs, float))
    n1, n2 = a.shape[-1], b.shape[-1]
    df = n1 + n2 - 2
    from scipy.stats import t

    diff = a.mean(axis=-1) - b.mean()
    squares = ((a - a.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1) + ((b - b.mean()) ** 2).sum()
    sd = np.sqrt(squares / df)
    se = sd * math.sqrt(1 / n1 + 1 / n2)
    none = se < _NO_SPREAD
    diff = np.where(none & (np.abs(diff) < _NO_SPREAD), 0.0, diff)
    half = np.where(none, 0.0, t.ppf((1 + confidence) / 2, df) * se)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(none, (np.abs(diff) < _NO_SPREAD).astype(float), 2 * t.sf(np.abs(diff / se), df))
    return {"ratio": np.exp(diff), "low": np.exp(diff - half), "high": np.exp(diff + half), "p": p,
            "sd": np.where(none, 0.0, sd), "df": df}


def outcome(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Index into OUTCOMES of each interval (ratios) against the tolerance band."""
    lo, hi = np.exp(_band())
    within = (low >= lo) & (high <= hi)
    beyond = (low > hi) | (high < lo)
    return np.where(within, 0, np.where(beyond, 2, 1))


def assess(yours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """The method, for one set of your runs or many (the running verdict's simulated sets).

    `yours` is (..., n1, k) per-run values, `theirs` (n2, k); the k columns are QUANTITIES (k = 3) or
    time to train alone (k = 1, runs that log no samples). Returns {"intervals": {quantity:
    ratio_interval}, "outcomes": {quantity: index into OUTCOMES}, "primary": the quantity that decides
    "reproduced", "verdict": index into VERDICTS} (arrays over the leading axes of `yours`).
    """
    yours, theirs = np.asarray(yours, float), np.asarray(theirs, float)
    keys = QUANTITIES if theirs.shape[-1] == len(QUANTITIES) else QUANTITIES[:1]
    each = each_confidence(len(keys))
    intervals = {key: ratio_interval(yours[..., i], theirs[:, i], each) for i, key in enumerate(keys)}
    outcomes = {key: outcome(iv["low"], iv["high"]) for key, iv in intervals.items()}
    primary = "time_per_sample" if "time_per_sample" in keys else "time_to_train"
    beyond = np.any([o == 2 for o in outcomes.values()], axis=0)
    verdict = np.where(beyond, 2, np.where(outcomes[primary] == 0, 0, 1))
    return {"intervals": intervals, "outcomes": outcomes, "primary": primary, "verdict": verdict}


def power(sd: float, n_yours: int, n_reference: int, quantities: int = len(QUANTITIES)) -> dict[str, Any]:
    """What runs of this spread can tell at these counts, `quantities` being judged (noncentral t,
    scipy.stats.nct).

    detectable_slowdown_pct: the smallest slowdown called "not reproduced" with probability POWER;
    p_reproduced_if_same: the probability (a lower bound: one minus both tests' misses) that an exact
    reproduction is called "reproduced".
    """
    from scipy.optimize import brentq
    from scipy.stats import nct, t

    df = n_yours + n_reference - 2
    low, high = _band()
    se = sd * math.sqrt(1 / n_yours + 1 / n_reference)
    out: dict[str, Any] = {"power": POWER, "alpha": ALPHA, "runs_yours": n_yours, "runs_reference": n_reference,
                           "spread_pct": sd * 100}
    if se < _NO_SPREAD:
        return {**out, "detectable_slowdown_pct": TOLERANCE_PCT, "p_reproduced_if_same": 1.0}
    crit = t.ppf((1 + each_confidence(quantities)) / 2, df)

    def shortfall(log_slowdown: float) -> float:
        return float(nct.sf(crit, df, (log_slowdown - high) / se)) - POWER

    top = high + 1.0
    while shortfall(top) < 0:
        top = high + 2 * (top - high)
    slowdown = brentq(shortfall, high, top, xtol=1e-6)
    same = float(nct.sf(crit, df, high / se)) + float(nct.sf(crit, df, -low / se)) - 1
    return {**out, "detectable_slowdown_pct": math.expm1(slowdown) * 100, "p_reproduced_if_same": max(same, 0.0)}


def _columns(score: dict | None, with_samples: bool) -> np.ndarray:
    """The counted runs as assess reads them: (runs, 3) or (runs, 1)."""
    runs = _counted(score)
    if with_samples:
        return np.array([[r["minutes"], r["minutes"] / r["samples_to_converge"] * 1000, r["samples_to_converge"]]
                         for r in runs]).reshape(-1, 3)
    return np.array([[r["minutes"]] for r in runs]).reshape(-1, 1)


def _pct_of(ratio: float) -> float:
    return (ratio - 1) * 100


def tests_of(yours: dict | None, theirs: dict | None) -> tuple[dict, dict | None, str]:
    """The per-quantity tests of a verdict.json, its power, and the verdict they give (before validity)."""
    counted_yours, counted_theirs = _counted(yours), _counted(theirs)
    with_samples = all(r.get("samples_to_converge") for r in counted_yours + counted_theirs)
    values = {"time_to_train": "minutes", "time_per_sample": "speed", "samples_to_converge": "samples"}
    tests: dict[str, Any] = {}
    for key, what in values.items():
        mine, ref = _values(yours, what), _values(theirs, what)
        tests[key] = {"n_yours": len(mine), "n_theirs": len(ref), "p": None,
                      "difference_pct": _pct(olympic(mine), olympic(ref)), "yours": olympic(mine),
                      "theirs": olympic(ref)}
    n1, n2 = len(counted_yours), len(counted_theirs)
    if n1 < 1 or n2 < 1 or n1 + n2 < 3:
        for test in tests.values():
            test["note"] = "too few runs to test (needs three in all, one a side)"
        return tests, None, INCONCLUSIVE
    found = assess(_columns(yours, with_samples)[None], _columns(theirs, with_samples))
    for key, test in tests.items():
        if key not in found["intervals"]:
            test["note"] = "not tested: not every run logs its samples to converge"
            continue
        iv = found["intervals"][key]
        test.update(p=float(iv["p"][0]), ratio=float(iv["ratio"][0]), ratio_pct=_pct_of(float(iv["ratio"][0])),
                    interval_pct=[_pct_of(float(iv["low"][0])), _pct_of(float(iv["high"][0]))],
                    confidence=each_confidence(len(found["intervals"])), spread_pct=float(iv["sd"][0]) * 100,
                    tolerance=OUTCOMES[int(found["outcomes"][key][0])])
        test["beyond_spread"] = test["p"] < ALPHA
        test["different"] = test["tolerance"] == BEYOND
    primary = found["primary"]
    stated = {"quantity": primary, **power(float(found["intervals"][primary]["sd"][0]), n1, n2,
                                           len(found["intervals"]))}
    return tests, stated, VERDICTS[int(found["verdict"][0])]


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


def interval_text(test: dict) -> str:
    """'+10.0% (90% interval +9.1% to +10.9%)': a test's ratio as the why and the report quote it."""
    low, high = test["interval_pct"]
    return f"{test['ratio_pct']:+.1f}% ({confidence_text(test['confidence'])} interval {low:+.1f}% to {high:+.1f}%)"


def confidence_text(confidence: float) -> str:
    """'98.3%', '95%'."""
    return f"{confidence * 100:.3g}%"


def power_text(stated: dict | None) -> str:
    """What these runs can tell, in a sentence."""
    if not stated:
        return "too few runs to test"
    return (f"with {stated['runs_yours']} runs against {stated['runs_reference']} and a run-to-run spread of "
            f"{stated['spread_pct']:.1f}% in {LABELS[stated['quantity']]}, a slowdown of "
            f"{stated['detectable_slowdown_pct']:.1f}% or more is called not reproduced "
            f"{stated['power']:.0%} of the time, and an exact reproduction is called reproduced "
            + (f"at least {same:.0%} of the time" if (same := stated["p_reproduced_if_same"]) >= 0.01 else
               "almost never (the interval is wider than the tolerance)"))


def _why(tests: dict, stated: dict | None, found: str, difference_pct: float | None) -> list[str]:
    if found == NOT_REPRODUCED:
        return [f"{LABELS[key]} {abs(t['ratio_pct']):.1f}% {'higher' if t['ratio_pct'] > 0 else 'lower'} than the "
                f"reference's ({confidence_text(t['confidence'])} interval {t['interval_pct'][0]:+.1f}% to "
                f"{t['interval_pct'][1]:+.1f}%), beyond the {TOLERANCE_PCT:g}% tolerance"
                for key, t in tests.items() if t.get("different")]
    if stated is None:
        return [f"{TOO_FEW}: {tests['time_to_train']['n_yours']} counted runs against "
                f"{tests['time_to_train']['n_theirs']}, too few to test"]
    primary = tests[stated["quantity"]]
    label = LABELS[stated["quantity"]]
    if found == REPRODUCED:
        head = f"difference {difference_pct:+.1f}%: " if difference_pct is not None else ""
        tail = "" if difference_pct is not None else "; the reference has no score to state the difference in %"
        return [f"{head}{label} {interval_text(primary)} is within the {TOLERANCE_PCT:g}% tolerance{tail}"]
    return [f"{TOO_FEW}: {label} {interval_text(primary)} is neither within the {TOLERANCE_PCT:g}% tolerance nor "
            f"wholly beyond it", power_text(stated)]


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
        "tolerance_pct": TOLERANCE_PCT,
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
    tests, stated, found = tests_of(yours, theirs)
    out["tests"], out["power"] = tests, stated
    why = _why(tests, stated, found, out["difference_pct"])
    if not out["valid"]:
        out["verdict"] = NOT_VALID
        why = out["reasons"] + (why if found == NOT_REPRODUCED else [])
    else:
        out["verdict"] = found
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
