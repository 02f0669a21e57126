"""The running verdict: after each finished seed, how likely the finished reproduction is to end each way.

The final verdict (mlrepro.scoring.verdict) says "reproduced", "inconclusive" or "not reproduced"
from the score's validity (at most `max_failed` runs failed) and verdict.assess: per quantity (time
to train, time per sample, samples to converge) the interval of the ratio of the geometric means
against the tolerance band. This module asks that same question of reproductions that are not
finished yet, with the same function.

Method (stated in METHOD, shown in status and the report): the seeds still to run are simulated
`simulations` times, and each completed set of N seeds is put through the same validity rule and
verdict.assess. A missing seed
- fails to converge with a probability drawn from Beta(0.5 + failed, 0.5 + converged) of the seeds
  seen (Jeffreys' prior), and otherwise
- has log(samples to converge) and log(time per sample) = your level + a residual. The level is
  drawn around the mean of your counted seeds with Student's t spread (pooled standard deviation of
  your seeds and the reference's runs, (c-1)+(n_ref-1) degrees of freedom, scale 1/sqrt(c)), so a
  level measured on three seeds is held loosely; the residual is one of the seen seeds' or the
  reference runs' own deviations from their mean, resampled as a pair (samples and speed of one run).
Time to train = samples x time per sample. Where runs log no samples, time to train alone is modelled.

A stop is then justified only by what the verdict itself would say: the probability that the
reproduction ends "not reproduced" (or not valid) is at least the configured confidence, split over
the looks (one after each seed from min_seeds on: 1 - (1 - confidence) / looks each, Bonferroni); a
reproduction heading for "inconclusive" is not stopped. How often that stops a reproduction that would
not have ended "not reproduced" is measured by benchmarks/false_stop.py (resampling shipped and
published reference runs as if they were yours) and bounded in a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mlrepro.scoring import verdict

METHOD = ("the seeds still to run are simulated {simulations} times from what has been seen (failure rate: "
          "Beta(0.5 + failed, 0.5 + converged); level of log samples-to-converge and log time-per-sample: your "
          "seeds' mean with Student-t uncertainty; run-to-run residuals resampled from your seeds and the "
          "reference's runs), and each completed set of {required} seeds is judged by the final verdict's rule: "
          "valid (at most {max_failed} failed), then " + verdict.METHOD)
SIMULATIONS = 4000
# A quick look first: a stop needs P(not reproduced) >= confidence, which a few hundred
# simulations already rule out for most checkpoints (measured by benchmarks/false_stop.py).
SCREEN_SIMULATIONS = 300
SCREEN_MARGIN = 0.05
# The simulation's own seed: status and the report show the same figure for the same seeds.
RNG_SEED = 20261126


class PolicyError(ValueError):
    """The early_stop block of a benchmark or system file is invalid; the message names the key."""


@dataclass(frozen=True)
class EarlyStop:
    """Stop a reproduction once it will be "not reproduced" with probability >= confidence."""

    confidence: float = 0.99
    min_seeds: int = 3
    cancel_diverged: bool = False  # also cancel a running seed whose evaluations leave the reference band

    def threshold(self, required: int) -> float:
        """P(not reproduced) a single look needs: the false-stop budget 1 - confidence is split
        evenly over the looks the policy may take (seeds min_seeds .. required-1; Bonferroni),
        so that looking after every seed does not add up to more than the budget."""
        looks = max(required - self.min_seeds, 1)
        return 1 - (1 - self.confidence) / looks


def early_stop_policy(raw: Any, source: str) -> EarlyStop | None:
    """The `early_stop:` block of `source` (a benchmark or system file); None when absent or off.

    Accepted: null/false (off), true (defaults), or {confidence: 0.5..0.9999, min_seeds: >= 2}.
    """
    if raw is None or raw is False:
        return None
    if raw is True:
        return EarlyStop()
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: early_stop: must be a mapping such as {{confidence: 0.99, min_seeds: 3}}, "
                          f"true or false (got {raw!r})")
    unknown = sorted(set(raw) - {"confidence", "min_seeds", "enabled", "cancel_diverged"})
    if unknown:
        raise PolicyError(f"{source}: early_stop: unknown key {', '.join(map(repr, unknown))} "
                          "(allowed: confidence, min_seeds, enabled, cancel_diverged)")
    if raw.get("enabled") is False:
        return None
    confidence = raw.get("confidence", EarlyStop.confidence)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise PolicyError(f"{source}: early_stop.confidence: {confidence!r} is not a probability in [0.5, 1)")
    min_seeds = raw.get("min_seeds", EarlyStop.min_seeds)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
        raise PolicyError(f"{source}: early_stop.min_seeds: {min_seeds!r} is not a whole number of at least 2")
    return EarlyStop(confidence=float(confidence), min_seeds=min_seeds,
                     cancel_diverged=bool(raw.get("cancel_diverged", False)))


@dataclass(frozen=True)
class Run:
    """One finished seed as the verdict sees it: counted (converged, valid) or failed."""

    counted: bool
    minutes: float | None = None
    samples: float | None = None


def runs_of(score_runs: Sequence[dict]) -> list[Run]:
    """Runs from run.json records (mlrepro.scoring.score.score_run); duplicates are not seeds."""
    out = []
    for r in score_runs:
        if r.get("duplicate"):
            continue
        counted = bool(r.get("counted")) and r.get("minutes") is not None
        out.append(Run(counted, r.get("minutes") if counted else None,
                       r.get("samples_to_converge") if counted else None))
    return out


def _plain(runs: Sequence[Run], with_samples: bool) -> np.ndarray:
    """Per counted run the values the verdict tests, computed as it computes them:
    [minutes, minutes per 1000 samples, samples], or [minutes] where runs log no samples."""
    counted = [r for r in runs if r.counted]
    if with_samples:
        return np.array([[r.minutes, r.minutes / r.samples * 1000, r.samples] for r in counted]).reshape(-1, 3)
    return np.array([[r.minutes] for r in counted]).reshape(-1, 1)


def _modelled(plain: np.ndarray) -> np.ndarray:
    """The log-scale columns the simulation draws: log samples and log time per sample (or log minutes)."""
    return np.log(plain[:, [2, 1]]) if plain.shape[1] == 3 else np.log(plain)


def _to_plain(logs: np.ndarray) -> np.ndarray:
    if logs.shape[-1] == 1:
        return np.exp(logs)
    # Samples are counts: whole numbers, so that a simulated seed ties with logged ones as logged
    # runs tie with each other (exp(log(3072)) is not 3072 in floating point).
    samples, speed = np.rint(np.exp(logs[..., 0])), np.exp(logs[..., 1])
    return np.stack([samples * speed / 1000, speed, samples], axis=-1)


def _judged(yours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """The final verdict's own method (verdict.assess) on each simulated set (simulations x runs x columns):
    an index into verdict.VERDICTS per set."""
    return verdict.assess(yours, theirs)["verdict"]


def _draw_new(seen: np.ndarray, ref: np.ndarray, rows: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` x `count` simulated counted seeds (log-scale columns)."""
    c, n = len(seen), len(ref)
    ref_mean = ref.mean(axis=0)
    residuals = ref - ref_mean
    if c:
        residuals = np.vstack([seen - seen.mean(axis=0), residuals])
    dof = max(c - 1, 0) + n - 1
    sd = np.sqrt((residuals ** 2).sum(axis=0) / max(dof, 1))
    # Without a counted seed of yours, your level is anyone's guess around the reference's.
    centre, scale = (seen.mean(axis=0), sd / math.sqrt(c)) if c else (ref_mean, sd)
    level = centre + scale * rng.standard_t(max(dof, 1), size=(rows, 1, ref.shape[1]))
    picks = rng.integers(0, len(residuals), size=(rows, count))
    return level + residuals[picks]


NOT_VALID = len(verdict.VERDICTS)  # a simulated set with more failed seeds than the score allows


def final_verdicts(seen: Sequence[Run], reference: Sequence[Run], required: int, max_failed: int,
                   simulations: int = SIMULATIONS, rng_seed: int = RNG_SEED) -> np.ndarray | None:
    """The final verdict of each simulated completion of `seen` to `required` seeds: an index into
    verdict.VERDICTS, or NOT_VALID. One entry when nothing is left to simulate; None when there is
    nothing to compare with (no counted reference runs)."""
    ref_counted = [r for r in reference if r.counted]
    failed = sum(not r.counted for r in seen)
    if failed > max_failed:
        return np.array([NOT_VALID])
    if len(ref_counted) < 2:
        return None
    with_samples = all(r.samples for r in [*ref_counted, *(r for r in seen if r.counted)])
    ref = _plain(ref_counted, with_samples)
    mine = _plain(seen, with_samples)
    missing = max(required - len(seen), 0)
    if missing == 0:
        return _judged(mine[None], ref) if len(mine) else np.array([verdict.VERDICTS.index(verdict.INCONCLUSIVE)])
    rng = np.random.default_rng(rng_seed)
    k = len(seen)
    p_fail = rng.beta(0.5 + failed, 0.5 + k - failed, size=simulations)
    total_failed = failed + rng.binomial(missing, p_fail)
    out = np.full(simulations, NOT_VALID)
    for f in range(failed, max_failed + 1):
        rows = np.flatnonzero(total_failed == f)
        if not len(rows):
            continue
        new = _to_plain(_draw_new(_modelled(mine), _modelled(ref), len(rows), missing - (f - failed), rng))
        yours = np.concatenate([np.broadcast_to(mine, (len(rows), *mine.shape)), new], axis=1)
        out[rows] = _judged(yours, ref)
    return out


def probabilities(seen: Sequence[Run], reference: Sequence[Run], required: int, max_failed: int,
                  simulations: int = SIMULATIONS, rng_seed: int = RNG_SEED) -> dict[str, float] | None:
    """{"reproduced", "inconclusive", "not reproduced"}: how likely the finished reproduction ends each
    way; a score that cannot be valid counts as not reproduced. None without counted reference runs."""
    ends = final_verdicts(seen, reference, required, max_failed, simulations, rng_seed)
    if ends is None:
        return None
    shares = {name: float((ends == i).mean()) for i, name in enumerate(verdict.VERDICTS)}
    shares[verdict.NOT_REPRODUCED] += float((ends == NOT_VALID).mean())
    return shares


def probability_reproduced(seen: Sequence[Run], reference: Sequence[Run], required: int, max_failed: int,
                           simulations: int = SIMULATIONS, rng_seed: int = RNG_SEED) -> float | None:
    """P(the finished reproduction of `required` seeds is judged reproduced), given `seen` seeds.

    None when there is nothing to compare with (no counted reference runs); 0.0 once more than
    `max_failed` seeds failed (the score cannot be valid any more).
    """
    shares = probabilities(seen, reference, required, max_failed, simulations, rng_seed)
    return None if shares is None else shares[verdict.REPRODUCED]


def outlook(seen: Sequence[Run], reference: Sequence[Run] | None, required: int, max_failed: int,
            simulations: int = SIMULATIONS) -> dict:
    """The running verdict as status, score.json and the report show it."""
    shares = probabilities(seen, reference or [], required, max_failed, simulations)
    failed = sum(not r.counted for r in seen)
    out = {"seeds_finished": len(seen), "seeds_required": required, "seeds_failed": failed,
           "p_reproduced": None if shares is None else shares[verdict.REPRODUCED],
           "p_inconclusive": None if shares is None else shares[verdict.INCONCLUSIVE],
           "p_not_reproduced": None if shares is None else shares[verdict.NOT_REPRODUCED],
           "simulations": simulations,
           "method": METHOD.format(simulations=simulations, required=required, max_failed=max_failed)}
    if failed > max_failed:
        out["why"] = f"{failed} seeds failed; at most {max_failed} may: the score cannot be valid"
    elif shares is None:
        out["why"] = "no reference runs to compare with: only the seeds' own spread is reported"
    return out


def outlook_text(out: dict) -> str:
    """'P(reproduced) = 0.000, P(inconclusive) = 0.812, P(not reproduced) = 0.188' (an outlook written before
    the inconclusive verdict: its P(reproduced) alone); its why where it has no probability."""
    if out.get("p_reproduced") is None:
        return str(out.get("why"))
    shown = ["reproduced", "inconclusive", "not reproduced"] if out.get("p_inconclusive") is not None else ["reproduced"]
    return ", ".join(f"P({name}) = {out['p_' + name.replace(' ', '_')]:.3f}" for name in shown)


def should_stop(seen: Sequence[Run], reference: Sequence[Run] | None, required: int, max_failed: int,
                policy: EarlyStop | None, simulations: int = SIMULATIONS) -> dict:
    """{"stop": bool, "p_not_reproduced": float | None, "why": str}: whether to stop submitting now.

    Only a settled "not reproduced" stops: a reproduction on its way to "reproduced" needs all its
    seeds to be a complete result, and one on its way to "inconclusive" needs them to tell more.
    Never before `min_seeds` seeds have finished, never after the last.
    """
    k = len(seen)
    if policy is None:
        return {"stop": False, "p_not_reproduced": None, "why": "early stop is off"}
    if k < policy.min_seeds or k >= required:
        return {"stop": False, "p_not_reproduced": None,
                "why": f"{k} of {required} seeds finished (early stop looks from seed {policy.min_seeds} on)"}
    quick = probabilities(seen, reference or [], required, max_failed, SCREEN_SIMULATIONS)
    if quick is None:
        return {"stop": False, "p_not_reproduced": None, "why": "no reference runs to compare with"}
    p_not = quick[verdict.NOT_REPRODUCED]
    needed = policy.threshold(required)
    if p_not < needed - SCREEN_MARGIN:
        return {"stop": False, "p_not_reproduced": p_not, "why": f"not settled (P(not reproduced) ~ {p_not:.2f})"}
    p_not = probabilities(seen, reference or [], required, max_failed, simulations)[verdict.NOT_REPRODUCED]
    stop = p_not >= needed
    return {"stop": stop, "p_not_reproduced": p_not, "threshold": needed,
            "why": (f"not reproduced with probability {p_not:.4f} >= {needed:.4f} (confidence {policy.confidence} "
                    f"over {max(required - policy.min_seeds, 1)} looks)" if stop
                    else f"not settled (P(not reproduced) = {p_not:.4f} < {needed:.4f})")}


def stop_message(finished: int, required: int, p_not: float, saved: float | None, unit: str) -> str:
    """The line score.json and the report carry for a stopped reproduction."""
    # Never rounded up past what was measured: no simulation reproduced reads 1 - 1/simulations.
    p_shown = math.floor(min(p_not, 1 - 1 / SIMULATIONS) * 1000) / 1000
    saving = f", saving {saved:.3g} {unit}" if saved is not None else ""
    return (f"stopped after {finished} of {required} seeds: not reproduced with probability >= {p_shown:.3f}"
            f"{saving}; not a complete MLPerf result")


def _resampled(pool: Sequence[Run], count: int, slowdown: float, rng: np.random.Generator) -> list[Run]:
    """`count` runs drawn from `pool` with replacement, "as if they were yours", their time per sample
    (so their minutes) multiplied by `slowdown`."""
    return [Run(True, r.minutes * slowdown, r.samples) if r.counted else r
            for r in (pool[i] for i in rng.integers(0, len(pool), count))]


def simulate_policy(pool: Sequence[Run], required: int, max_failed: int, policy: EarlyStop, reproductions: int,
                    slowdown: float = 1.0, rng_seed: int = 0, simulations: int = SIMULATIONS) -> dict:
    """The policy applied to `reproductions` reproductions drawn from `pool` (reference runs "as if they
    were yours", with replacement; their time per sample multiplied by `slowdown`), judged against `pool`.

    Returns counts: final_reproduced, final_inconclusive, final_not_reproduced (the verdict with all seeds;
    a score that cannot be valid is not reproduced), stops, false_stops (stopped, yet not "not reproduced"
    with all seeds), seeds_at_stop (sum, for the mean) and false_stop_rate (false stops among the
    reproductions that do not end "not reproduced").
    """
    rng = np.random.default_rng(rng_seed)
    counted = [r for r in pool if r.counted]
    out = {"reproductions": reproductions, "final_reproduced": 0, "final_inconclusive": 0, "final_not_reproduced": 0,
           "false_stops": 0, "stops": 0, "seeds_at_stop": 0}
    for _ in range(reproductions):
        yours = _resampled(pool, required, slowdown, rng)
        end = int(final_verdicts(yours, counted, required, max_failed)[0])
        final = verdict.NOT_REPRODUCED if end == NOT_VALID else verdict.VERDICTS[end]
        out["final_" + final.replace(" ", "_")] += 1
        for k in range(policy.min_seeds, required):
            if should_stop(yours[:k], counted, required, max_failed, policy, simulations)["stop"]:
                out["stops"] += 1
                out["seeds_at_stop"] += k
                out["false_stops"] += final != verdict.NOT_REPRODUCED
                break
    healthy = reproductions - out["final_not_reproduced"]
    out["false_stop_rate"] = out["false_stops"] / healthy if healthy else None
    return out


def simulate_verdicts(pool: Sequence[Run], runs: int, slowdown: float, reproductions: int,
                      rng_seed: int = 0) -> dict[str, int]:
    """How often the final verdict says each thing of `reproductions` reproductions of `runs` counted runs
    drawn from `pool`'s counted runs, their time per sample multiplied by `slowdown`, against `pool`:
    {verdict: count}. All sets at once, through the verdict's own verdict.assess."""
    rng = np.random.default_rng(rng_seed)
    counted = [r for r in pool if r.counted]
    with_samples = all(r.samples for r in counted)
    ref = _plain(counted, with_samples)
    yours = ref[rng.integers(0, len(ref), size=(reproductions, runs))]
    # Slower per sample: minutes and minutes per sample scale, samples to converge do not.
    yours[..., :2] *= slowdown
    ends = _judged(yours, ref)
    return {name: int((ends == i).sum()) for i, name in enumerate(verdict.VERDICTS)}


# What benchmarks/false_stop.py measured (the report's method note quotes it; rerun it after changing the method).
FALSE_STOP_MEASURED = {
    "command": "benchmarks/false_stop.py",
    "summary": ("over the shipped miniatures' runs and every published v5.0 llama2_70b_lora system (52 pools that may "
                "stop, 10 runs each; 100 resampled reproductions a pool): 0 false stops in 5175 reproductions that "
                "do not end \"not reproduced\", 95% upper bound 0.0006, against a budget of 0.01 at confidence 0.99. "
                "A machine 25% slower per sample is stopped after 3 seeds on all 51 published llama2_70b_lora systems"),
}
