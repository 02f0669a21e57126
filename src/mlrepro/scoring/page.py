"""What every HTML page of the scorer shares (the report, the verdict section, the summary): the style
sheet, escaping, numbers formatted to what they mean, and matplotlib figures inlined as SVG, so a page
needs nothing beside it.

    p_value(0.000183)        '< 0.001'          (never 1.83e-04; 1 reads '1.00')
    percent(12.345)          '+12.3%'
    minutes(0.2122)          '0.212 (13 s)'     (MLPerf's three decimals; a miniature's seconds beside)
    compliance(run, score)   ('no ruleset (miniature)', 'na') rather than a red "not run"
    metric(target, bench)    'eval_accuracy: evaluation loss (lower is better)'
"""

from __future__ import annotations

import html
import math
from typing import Any

# The page's style: the content keeps to the window; a table wider than it scrolls in its own box
# (.scroll), never the page; figures shrink to the width they have.
CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1em;max-width:1100px;color:#222;line-height:1.4}
h1{margin:.2em 0;font-size:1.6em;overflow-wrap:anywhere}
.verdict{font-size:1.3em;padding:.6em 1em;border-radius:6px;margin:.8em 0}
.valid,.ok-box{background:#e3f6e5;border:1px solid #3a3} .invalid,.bad-box{background:#fde8e8;border:1px solid #c33}
.na-box{background:#f3f3f3;border:1px solid #bbb}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.92em} td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums} td.num{white-space:nowrap}
th{background:#f3f3f3} .bad{color:#b00} .ok{color:#070} .warn{color:#a60} .na{color:#666}
figure{margin:1em 0;max-width:100%} figure svg{max-width:100%;height:auto;display:block}
.small{color:#666;font-size:.85em} .why{font-size:.85em;color:#444}
"""
VIEWPORT = "<meta name='viewport' content='width=device-width, initial-scale=1'>"


def escape(x: Any) -> str:
    return html.escape("-" if x is None else str(x))


def number(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


ALPHA = 0.05

# What the metric a benchmark logs under `key` measures, where its name says otherwise: MLPerf's
# llama2_70b_lora logs its evaluation loss as eval_accuracy, llama31_405b its log perplexity.
MEANINGS = {
    ("llama2_70b_lora", "eval_accuracy"): "evaluation loss",
    ("llama31_405b", "eval_accuracy"): "log perplexity",
}
_LOWER = ("below", "<=", "<", "lower", "min")


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def p_value(p: float | None) -> str:
    """A p-value as a reader takes it: '< 0.001', '0.018', '0.32', '1.00'."""
    if _missing(p):
        return "-"
    if p < 0.001:
        return "< 0.001"
    if p < 0.01:
        return f"{p:.3f}"
    return f"{p:.2f}"


def differs(p: float | None, alpha: float = ALPHA) -> bool | None:
    return None if _missing(p) else p < alpha


def percent(x: float | None, signed: bool = True) -> str:
    if _missing(x):
        return "-"
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def minutes(m: float | None) -> str:
    """Minutes as MLPerf publishes them (11.275), with the seconds beside a time under a minute."""
    if _missing(m):
        return "-"
    return f"{m:.3f}" if m >= 1 else f"{m:.3f} ({m * 60:.0f} s)"


def factor(x: float | None) -> str:
    """An RCP scaling factor: '1' when none applies, else four decimals."""
    if _missing(x):
        return "-"
    return "1" if x == 1 else f"{x:.4f}"


def samples(x: float | None) -> str:
    return "-" if _missing(x) else f"{x:,.0f}"


def compliance(run: dict, score: dict) -> tuple[str, str]:
    """(text, css class) of a run's compliance: ok, bad, or na where no ruleset applies."""
    comp = run.get("compliance") or {}
    if not score.get("ruleset") and not score.get("mlperf_benchmark"):
        return "no ruleset (miniature)", "na"
    if not comp.get("checked"):
        return "not run", "warn"
    return ("pass", "ok") if comp.get("pass") else ("FAIL", "bad")


def measures(target: dict, mlperf_benchmark: str | None = None) -> str:
    """What the target's metric measures: the config's `measures`, else what MLPerf's benchmark logs under it."""
    what = target.get("measures") or MEANINGS.get((mlperf_benchmark or "", target.get("metric", "")))
    direction = "lower is better" if str(target.get("direction", "")).lower() in _LOWER else "higher is better"
    return f"{what} ({direction})" if what else direction


def metric(target: dict, mlperf_benchmark: str | None = None) -> str:
    """'eval_accuracy: evaluation loss (lower is better)'."""
    return f"{target.get('metric')}: {measures(target, mlperf_benchmark)}"


def target_text(target: dict) -> str:
    """'eval_accuracy ≤ 0.925' (the direction as a sign); a target of two numbers as its check reads."""
    if target.get("check") or target.get("value") is None:
        return str(target.get("check") or target.get("metric"))
    sign = "≤" if str(target.get("direction", "")).lower() in _LOWER else "≥"
    return f"{target.get('metric')} {sign} {target.get('value'):g}"


VERDICT_CLASS = {"reproduced": "ok", "seeds only": "ok", "not reproduced": "bad", "not valid": "bad"}


def verdict_class(verdict: str | None) -> str:
    return VERDICT_CLASS.get(str(verdict), "warn")
