"""How far a running MLPerf-style seed is, from the eval events in its live log.

An MLPerf run logs its evaluation metric with the samples trained so far:

    :::MLLOG {"time_ms": ..., "key": "eval_accuracy", "value": 1.40, "metadata": {"samples_count": 480}}

A run ends when the metric reaches the target, so its length is not known in advance; the best
guess is the reference's samples to converge (the mean of its converged runs, as RCP averages
them: the lowest and highest dropped when there are five or more). Progress is the samples so
far against that; the ETA is the samples still to go at the rate of the recent evals.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlrepro.util.progress import clock

RECENT = 4  # eval events the rate is measured over: recent enough to follow a slower phase
TAIL_BYTES = 1 << 18
_MARK = ":::MLLOG"


def events(text: str, keys: tuple[str, ...]) -> list[dict]:
    """The MLLOG events of `keys` in a log's text, in order; lines cut off or garbled are skipped."""
    found = []
    quoted = tuple(f'"{k}"' for k in keys)
    for line in text.splitlines():
        at = line.find(_MARK)
        if at < 0 or not any(q in line for q in quoted):
            continue
        try:
            event = json.loads(line[at + len(_MARK):])
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("key") in keys:
            found.append(event)
    return found


def reference_samples(reference: dict | None) -> float | None:
    """The reference's samples to converge: the mean of its converged runs (RCP's way), or None.

    `reference` is results/<benchmark>/reference.json (its score's runs), or a score itself.
    """
    if not reference:
        return None
    score = reference.get("score", reference)
    rcp_mean = (score.get("rcp") or {}).get("rcp_mean")
    if isinstance(rcp_mean, (int, float)) and rcp_mean > 0:
        return float(rcp_mean)
    samples = sorted(float(r["samples_to_converge"]) for r in score.get("runs") or []
                     if r.get("converged") and isinstance(r.get("samples_to_converge"), (int, float)))
    if len(samples) >= 5:
        samples = samples[1:-1]
    return sum(samples) / len(samples) if samples else None


def parse(text: str, metric: str, target: dict | None = None, reference: float | None = None) -> dict | None:
    """Progress of the run in `text` (its latest attempt's log), or None before its first eval."""
    found = events(text, (metric, "run_start"))
    evals = [e for e in found if e.get("key") == metric
             and isinstance((e.get("metadata") or {}).get("samples_count"), (int, float))]
    if not evals:
        return None
    starts = [e for e in found if e.get("key") == "run_start"]
    # A log may hold several runs (NEXP > 1): only the evals after the last run_start count.
    if starts:
        evals = [e for e in evals if e.get("time_ms", 0) >= starts[-1].get("time_ms", 0)] or evals[-1:]
    last = evals[-1]
    samples = float(last["metadata"]["samples_count"])
    recent = evals[-RECENT - 1:]
    rate = None
    if len(recent) >= 2:
        ds = float(recent[-1]["metadata"]["samples_count"]) - float(recent[0]["metadata"]["samples_count"])
        dt = (recent[-1].get("time_ms", 0) - recent[0].get("time_ms", 0)) / 1000
        rate = ds / dt if dt > 0 and ds > 0 else None
    eta = None
    if reference and rate:
        eta = max(0.0, reference - samples) / rate
    out = {"kind": "mlperf", "metric": metric, "evals": len(evals), "samples": samples, "value": last.get("value"),
           "samples_per_s": None if rate is None else round(rate, 2), "reference_samples": reference,
           "fraction": None if not reference else round(samples / reference, 4),
           "eta_s": None if eta is None else round(eta, 1), "beyond_reference": bool(reference and samples > reference),
           "last_eval_ms": last.get("time_ms")}
    if starts:
        out["elapsed_s"] = round((last.get("time_ms", 0) - starts[-1].get("time_ms", 0)) / 1000, 1)
    if target:
        out["target"] = {k: target.get(k) for k in ("metric", "value", "direction")}
    return out


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        text = fh.read().decode(errors="replace")
    # A cut first line is not an event; drop it unless the whole file was read.
    return text if size <= limit else text.split("\n", 1)[-1]


def describe(p: dict) -> str:
    """'eval 5: 480 of ~3,040 samples (16%), eval_accuracy 1.403 (target below 0.925), 152 samples/s, ETA 0:17'."""
    text = f"eval {p['evals']}: {p['samples']:,.0f}"
    if p.get("reference_samples"):
        text += f" of ~{p['reference_samples']:,.0f} samples ({100 * p['fraction']:.0f}%)"
    else:
        text += " samples"
    value = p.get("value")
    if isinstance(value, (int, float)):
        text += f", {p['metric']} {value:.4g}"
        t = p.get("target")
        if t and t.get("value") is not None:
            text += f" (target {t.get('direction')} {t['value']:g})"
    if p.get("samples_per_s"):
        text += f", {p['samples_per_s']:,.0f} samples/s"
    if p.get("beyond_reference"):
        text += ", past the reference's samples to converge: ETA unknown"
    elif p.get("eta_s") is not None:
        text += f", ETA {clock(p['eta_s'])}"
    return text
