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

Reproduced means: your score is valid and none of the three tests finds a difference.
Mann-Whitney makes no normality assumption and ten runs a side is what it needs to detect
a shift at alpha 0.05 (no overlap of the two sets gives p = 0.00018).

Without a reference (a miniature that ships no reference runs) the seeds are compared with
each other only: their spread and each seed's distance from the median.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from mlrepro.scoring import page
from mlrepro.scoring.page import escape, inline_svg, number, plt

ALPHA = 0.05
METHOD = ("two-sided Mann-Whitney U test (scipy.stats.mannwhitneyu) on the per-run values of your counted runs "
          f"against the reference's, alpha {ALPHA}")
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
    out["different"] = out["p"] < ALPHA
    return out


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
                       f"runs' spread (p {_p_shown(test['p'])})")
    if not out["valid"]:
        out["verdict"] = NOT_VALID
        why = out["reasons"] + why
    else:
        out["verdict"] = NOT_REPRODUCED if why else REPRODUCED
        if not why:
            why = [f"difference {out['difference_pct']:+.1f}% is within what the runs' spread explains"]
    out["why"] = why
    return out


# ---------------------------------------------------------------- rendering


def distribution_plot(verdict: dict) -> str:
    """Per-run time to train and time per sample, yours beside the reference's (SVG text)."""
    runs = verdict["runs"]
    ref_label = "reference" if verdict["reference"].get("kind") != "published" else "published"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (mine, theirs, title) in zip(axes, [
            (runs["yours"], runs["theirs"], "time to train per run (min)"),
            (runs["yours_per_ksample"], runs["theirs_per_ksample"], "minutes per 1000 samples")]):
        data = [(f"yours ({len(mine)})", mine, "#3a7bd5")]
        if theirs:
            data.append((f"{ref_label} ({len(theirs)})", theirs, "#999"))
        for i, (label, values, colour) in enumerate(data):
            if values:
                ax.boxplot([values], positions=[i], widths=.5, showfliers=False)
                jitter = [i + (k % 5 - 2) * .04 for k in range(len(values))]
                ax.scatter(jitter, values, color=colour, s=14, zorder=3)
        ax.set_xticks(range(len(data)), [d[0] for d in data])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=.3)
    return inline_svg(fig)


def _config_label(config: dict | None) -> str | None:
    if not config:
        return None
    return config["file"] + (" (generated by mlrepro plan: no published config fits)" if config.get("generated") else "")


def _env_rows(verdict: dict) -> list[tuple[str, str, str]]:
    env = verdict.get("environment") or {}
    container = env.get("container") or {}
    machine = container.get("environment") or {}
    system = verdict.get("system") or {}
    ref = verdict["reference"]
    desc = ref.get("system_desc") or {}
    ref_env = (ref.get("environment") or {}).get("environment") or {}
    stack = desc.get("other_software_stack")
    stack_s = ", ".join(f"{k} {v}" for k, v in stack.items()) if isinstance(stack, dict) else stack
    sub = system.get("submission") or {}
    packages = machine.get("packages") or {}
    ref_packages = ref_env.get("packages") or {}
    return [
        ("system", system.get("name"), desc.get("system_name") or ref.get("system")),
        ("implementation config", _config_label(verdict.get("config")), None),
        ("nodes x accelerators", f"{system.get('nodes')} x {system.get('gpus_per_node')}",
         f"{desc.get('number_of_nodes') or '-'} x {desc.get('accelerators_per_node') or '-'}"),
        ("accelerator", sub.get("accelerator_model_name") or system.get("device"), desc.get("accelerator_model_name")),
        ("host processor", sub.get("host_processor_model_name") or machine.get("machine"),
         desc.get("host_processor_model_name") or ref_env.get("machine")),
        ("container", container.get("tag") or container.get("runtime"), desc.get("framework")),
        ("image digest", container.get("digest") or container.get("image_id"), None),
        ("python / torch", f"{machine.get('python', '-')} / {packages.get('torch', '-')}" if machine else None,
         f"{ref_env.get('python', '-')} / {ref_packages.get('torch', '-')}" if ref_env else None),
        ("software stack", None, stack_s),
        ("operating system", machine.get("platform"), desc.get("operating_system") or ref_env.get("platform")),
        ("preflight", "present" if env.get("preflight") else "not run", None),
    ]


def _p_shown(p: float) -> str:
    """'< 0.001' or '= 0.02': how the why of a verdict quotes a p-value."""
    shown = page.p_value(p)
    return shown if shown.startswith("<") else f"= {shown}"


def render_section(verdict: dict, distribution_svg: str | None = None) -> str:
    """The verdict as an HTML fragment for the benchmark's report page."""
    ref = verdict["reference"]
    status = verdict["verdict"]
    css = {"reproduced": "valid", "seeds only": "valid"}.get(status, "invalid")
    parts = [f"<h2>Compared with the {'published result' if ref.get('kind') == 'published' else 'reference'}</h2>",
             f"<div class='verdict {css}' id='reproduction'>verdict: <b id='verdict-status'>{escape(status.upper())}</b>"]
    if verdict.get("reference_score_minutes") is not None:
        parts.append(f"<div class='small'>yours <b id='your-score'>{number(verdict['score_minutes'])}</b> min, "
                     f"{escape(ref.get('label'))} <b id='reference-score'>{number(verdict['reference_score_minutes'])}</b> "
                     f"min, difference <b id='difference'>{number(verdict['difference_pct'], '+.1f')}%</b></div>")
    parts.append("<ul>" + "".join(f"<li>{escape(w)}</li>" for w in verdict.get("why") or []) + "</ul></div>")
    match = ref.get("match") or {}
    because = str(match.get("because") or "")
    parts.append(f"<p class='small' id='reference-source'>Reference: {escape(ref.get('label'))}. "
                 f"{escape(because[:1].upper() + because[1:])}."
                 + (f" Source: {escape(ref['source'].get('url', ''))} {escape(ref['source'].get('folder'))} at "
                    f"{escape(ref['source'].get('commit'))}." if ref.get("kind") == "published" else "") + "</p>")
    if match.get("differences"):
        parts.append("<p>Your system differs from the published one:</p><ul id='differences'>"
                     + "".join(f"<li>{escape(d)}</li>" for d in match["differences"]) + "</ul>")
    if verdict.get("tests"):
        parts.append("<div class='scroll'><table id='tests'><tr><th>per run</th><th class='num'>yours</th>"
                     "<th class='num'>reference</th><th class='num'>difference</th>"
                     "<th class='num'>p</th><th>beyond the spread?</th></tr>")
        units = {"time_to_train": ("time to train (min, olympic)", ".3f"),
                 "time_per_sample": ("minutes per 1000 samples (olympic)", ".4f"),
                 "samples_to_converge": ("samples to converge (olympic)", ".1f")}
        for key, test in verdict["tests"].items():
            label, spec = units[key]
            parts.append(f"<tr><td>{label}</td><td class='num'>{number(test['yours'], spec)}</td>"
                         f"<td class='num'>{number(test['theirs'], spec)}</td>"
                         f"<td class='num'>{page.percent(test['difference_pct'])}</td>"
                         f"<td class='num'>{page.p_value(test['p'])}</td>"
                         f"<td>{'yes' if test.get('different') else ('no' if test['p'] is not None else escape(test.get('note')))}"
                         "</td></tr>")
        parts.append(f"<tr><td>RCP factor</td><td class='num'>{page.factor(verdict['rcp_factor'])}</td>"
                     f"<td class='num'>{page.factor(verdict['reference_rcp_factor'])}</td>"
                     f"<td class='num'>{page.percent(verdict['rcp_factor_difference_pct'])}</td><td>-</td><td>-</td>"
                     "</tr></table></div>")
        parts.append(f"<p class='small' id='method'>Test: {escape(verdict['method'])}. Time per sample separates the "
                     "machine's speed from the seed-to-seed variation of samples to converge.</p>")
    spread = verdict["seeds"]
    ref_spread = verdict.get("reference_seeds") or {}
    parts.append("<h3>Seeds compared with each other</h3>"
                 f"<p id='seed-spread'>yours: {spread['runs']} counted runs, median {number(spread['median'])} min, "
                 f"coefficient of variation {number(spread['cv_pct'], '.1f')}%, range {number(spread['range_pct'], '.1f')}% "
                 "of the median" + (f"; reference: {ref_spread['runs']} runs, CV {number(ref_spread['cv_pct'], '.1f')}%, "
                                    f"range {number(ref_spread['range_pct'], '.1f')}%" if ref_spread.get("runs") else "")
                 + "</p><div class='scroll'><table id='seeds'><tr><th>seed</th><th class='num'>minutes</th>"
                 "<th class='num'>from the median</th></tr>"
                 + "".join(f"<tr><td>{escape(s['seed'])}</td><td class='num'>{number(s['minutes'])}</td>"
                           f"<td class='num'>{page.percent(s['from_median_pct'])}</td></tr>" for s in spread["seeds"])
                 + "</table></div>")
    if distribution_svg:
        parts.append(f"<figure id='distribution-plot'>{distribution_svg}</figure>")
    parts.append("<h3>Environment</h3><div class='scroll'><table id='environment'><tr><th></th><th>yours</th><th>reference</th></tr>"
                 + "".join(f"<tr><th>{escape(k)}</th><td>{escape(a)}</td><td>{escape(b)}</td></tr>" for k, a, b in _env_rows(verdict))
                 + "</table></div>")
    return "".join(parts)
