"""The cost section of the reports and the cost columns of summary.csv (issue 24).

score.json carries `cost` (mlrepro.scoring.cost.benchmark_cost, with `planned` and `unit`),
`running_verdict` (mlrepro.scoring.running_verdict.outlook) and, for a reproduction the early stop
ended, `early_stop` (the decision in results/<benchmark>/early_stop.json).
"""

from __future__ import annotations

import html
from typing import Any

from mlrepro.scoring import running_verdict as rv

COLUMNS = ("spent_gpu_hours", "failed_gpu_hours", "planned_gpu_hours", "expected_gpu_hours", "cost_unit",
           "early_stop")


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _h(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def summary_columns(score: dict) -> dict:
    """The cost columns of one benchmark's row in summary.csv."""
    c = score.get("cost") or {}
    plan = c.get("planned") or {}
    stop = score.get("early_stop") or {}
    return {"spent_gpu_hours": c.get("gpu_hours"), "failed_gpu_hours": c.get("failed_gpu_hours"),
            "planned_gpu_hours": plan.get("upper_bound_gpu_hours"),
            "expected_gpu_hours": plan.get("expected_gpu_hours"), "cost_unit": c.get("unit"),
            "early_stop": stop.get("message")}


def section(score: dict) -> str:
    """The benchmark report's cost section: planned against spent, what failures cost, the running verdict."""
    c = score.get("cost")
    if not c:
        return ""
    unit = c.get("unit") or "GPU-hours"
    plan = c.get("planned") or {}
    parts = ["<h2 id='cost'>Cost</h2>"]
    stop = score.get("early_stop")
    if stop:
        parts.append(f"<div class='verdict invalid' id='early-stop'><b>{_e(stop.get('message'))}</b>"
                     f"<div class='small'>{_e(stop.get('why'))}</div></div>")
    rows = [("spent", c.get("gpu_hours"), f"{c.get('attempts', 0)} attempts, every one counted (nodes x "
             f"{'ranks' if unit == 'CPU-hours' else 'GPUs'} x elapsed)" + (" - some estimated from file times"
                                                                          if c.get("estimated") else "")),
            ("of which failed attempts", c.get("failed_gpu_hours"),
             f"{c.get('failed_attempts', 0)} attempts that failed, timed out, were cancelled or diverged"),
            ("planned, upper bound", plan.get("upper_bound_gpu_hours"),
             f"{plan.get('seeds', '-')} seeds x {plan.get('nodes', '-')} x {plan.get('gpus_per_node', '-')} x "
             f"the wall-time of {plan.get('walltime_minutes', '-')} min"),
            ("planned, expected", plan.get("expected_gpu_hours"),
             f"the reference's mean run time, {_h(plan.get('reference_mean_minutes'))} min a seed (start-up "
             "not included)" if plan.get("expected_gpu_hours") is not None else "no reference run times")]
    if stop and stop.get("saved_gpu_hours") is not None:
        rows.append(("saved by the early stop", stop["saved_gpu_hours"],
                     f"{stop['required'] - stop['stopped_after']} seeds not run, at the mean cost of those that ran"))
    energy = c.get("energy_kwh")
    rows.append(("energy", None, f"{energy:.3g} kWh" if energy is not None else "not reported by the job records"))
    parts.append(f"<div class='scroll'><table id='cost-table'><tr><th></th><th>{_e(unit)}</th><th></th></tr>"
                 + "".join(f"<tr><th>{_e(k)}</th><td class='num'>{_h(v)}</td><td class='small'>{_e(n)}</td></tr>"
                           for k, v, n in rows) + "</table></div>")
    upper = plan.get("upper_bound_gpu_hours") or 0
    if upper:
        pct = min(100.0, 100 * (c.get("gpu_hours") or 0) / upper)
        parts.append(f"<div id='cost-bar' title='spent / planned upper bound' style='background:#eee;width:420px;max-width:100%'>"
                     f"<div style='background:#3a7bd5;width:{pct:.1f}%;height:12px'></div></div>"
                     f"<p class='small'>spent {pct:.1f}% of the planned upper bound</p>")
    seeds = c.get("seeds") or {}
    if seeds:
        parts.append("<div class='scroll'><table id='cost-seeds'><tr><th>seed</th><th>attempts</th><th>failed</th><th>elapsed (s)</th>"
                     f"<th>{_e(unit)}</th><th>of which failed</th></tr>"
                     + "".join(f"<tr><td>{_e(s)}</td><td>{v['attempts']}</td><td>{v['failed_attempts']}</td>"
                               f"<td>{v['elapsed_s']:.0f}</td><td>{_h(v['gpu_hours'])}</td>"
                               f"<td>{_h(v['failed_gpu_hours'])}</td></tr>"
                               if not (v.get("stopped") and not v["attempts"]) else
                               f"<tr><td>{_e(s)}</td><td colspan='5' class='small'>not run: the early stop settled "
                               "the reproduction</td></tr>"
                               for s, v in sorted(seeds.items(), key=lambda kv: int(kv[0]))) + "</table></div>")
    parts.append(running_section(score.get("running_verdict")))
    return "".join(parts)


def running_section(outlook: dict | None) -> str:
    """The running verdict with its method and the measured false-stop rate."""
    if not outlook:
        return ""
    head = f"after {outlook['seeds_finished']} of {outlook['seeds_required']} seeds: " + _e(rv.outlook_text(outlook))
    measured = rv.FALSE_STOP_MEASURED
    return (f"<h3>Running verdict</h3><p id='running-verdict'>{head}</p>"
            f"<p class='small' id='running-method'>Method: {_e(outlook.get('method'))}. The early stop "
            f"(opt-in, early_stop: in the benchmark or system file) stops only a settled \"not reproduced\"; its "
            f"false-stop rate, measured by {_e(measured['command'])}: {_e(measured['summary'])}.</p>")
