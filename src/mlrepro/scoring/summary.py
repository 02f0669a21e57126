"""The final report: every configured benchmark and system in one table, with its verdict.

results/summary.csv and results/summary.json are the table (pandas); results/report.html
opens with it, each row linking to that benchmark's own report.html.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from mlrepro.scoring import cost_report, goodput

from mlrepro.util.fsutil import atomic_write_text
from mlrepro.scoring import page, side_by_side
from mlrepro.scoring.records import VerdictRecord
from mlrepro.scoring.verdict import METHOD

COLUMNS = ["benchmark", "system", "reference", "reference_kind", "score_minutes", "reference_score_minutes",
           "difference_pct", "p_time_to_train", "p_time_per_sample", "p_samples_to_converge", "samples_to_converge",
           "reference_samples_to_converge", "rcp_factor", "reference_rcp_factor", "valid", "verdict", "why", "report",
           "config", "config_generated", "spent_gpu_hours", "failed_gpu_hours", "planned_gpu_hours",
           "expected_gpu_hours", "cost_unit", "early_stop", *goodput.SUMMARY_COLUMNS]


def row(verdict: dict, report: str) -> dict:
    """One table row from a verdict.json; `report` is the benchmark's report.html, relative to the final report."""
    tests = verdict.get("tests") or {}

    def p(key: str):
        return (tests.get(key) or {}).get("p")

    samples = tests.get("samples_to_converge") or {}
    ref = verdict["reference"]
    return {
        "benchmark": verdict["benchmark"],
        "system": (verdict.get("system") or {}).get("name"),
        "reference": ref.get("label"),
        "reference_kind": ref.get("kind"),
        "score_minutes": verdict.get("score_minutes"),
        "reference_score_minutes": verdict.get("reference_score_minutes"),
        "difference_pct": verdict.get("difference_pct"),
        "p_time_to_train": p("time_to_train"),
        "p_time_per_sample": p("time_per_sample"),
        "p_samples_to_converge": p("samples_to_converge"),
        "samples_to_converge": samples.get("yours"),
        "reference_samples_to_converge": samples.get("theirs"),
        "rcp_factor": verdict.get("rcp_factor"),
        "reference_rcp_factor": verdict.get("reference_rcp_factor"),
        "valid": verdict.get("valid"),
        "verdict": verdict["verdict"],
        "why": "; ".join(verdict.get("why") or []),
        "report": report,
        # the implementation config the runs used; generated: written by mlrepro plan, not published
        "config": (verdict.get("config") or {}).get("file"),
        "config_generated": (verdict.get("config") or {}).get("generated"),
        **cost_report.summary_columns(verdict),
        **goodput.summary_columns(verdict),
    }


def summary_table(verdict_files: Iterable[str | os.PathLike], out_dir: str | os.PathLike) -> pd.DataFrame:
    """The table of all verdicts; each row's report link is relative to `out_dir`."""
    rows = []
    for path in map(Path, verdict_files):
        report = os.path.relpath(path.parent / "report.html", Path(out_dir))
        rows.append(row(VerdictRecord.read(path).to_json(), report))
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if column == "report":
        return f"<a href='{html.escape(str(value))}'>report</a>"
    if column == "difference_pct":
        return page.percent(value)
    if column.startswith("p_"):
        return page.p_value(value)
    if "rcp" in column:
        return page.factor(value)
    if "minutes" in column:
        return page.minutes(value)
    if isinstance(value, float):
        return f"{value:.1f}"
    return html.escape(str(value))


# The verdict first; the why and the config on a line of their own under each row, so the table fits
# a laptop's page and scrolls in its own box on a phone.
SHOWN = ["verdict", "benchmark", "system", "score_minutes", "reference_score_minutes", "difference_pct", "p", "rcp",
         "cost", "report"]
NUMERIC = {"score_minutes", "reference_score_minutes", "difference_pct", "rcp"}
# Column headings of the page (the CSV and JSON keep the column names).
LABELS = {"score_minutes": "your score (min)", "reference_score_minutes": "reference score (min)",
          "difference_pct": "difference", "p": "differs? (p)", "rcp": "RCP factor: yours / reference",
          "cost": "spent / planned (upper bound)"}


def _tests(rec: dict) -> str:
    """'yes: per sample (p < 0.001)' or 'no (p 0.32 / 0.45 / 1.00)'; '-' without tests."""
    names = {"p_time_to_train": "time", "p_time_per_sample": "per sample", "p_samples_to_converge": "samples"}
    ps = {k: rec[k] for k in names if not (rec[k] is None or (isinstance(rec[k], float) and pd.isna(rec[k])))}
    if not ps:
        return "-"
    differ = [f"{names[k]} (p {page.p_value(p)})" for k, p in ps.items() if page.differs(p)]
    if differ:
        return "<b class='bad'>yes</b>: " + ", ".join(html.escape(d) for d in differ)
    return "no (" + ", ".join(f"{names[k]} p {page.p_value(p)}" for k, p in ps.items()) + ")"


def render_final(table: pd.DataFrame, same_model: Sequence[tuple[str, Sequence[dict]]] = ()) -> str:
    """The final report page: the verdict table first, then how verdicts are reached, then the benchmarks
    of one model and corpus side by side (`same_model`: title and mlrepro.scoring.side_by_side rows)."""
    head = "".join(f"<th class='{'num' if c in NUMERIC else ''}'>{html.escape(LABELS.get(c, c.replace('_', ' ')))}</th>"
                   for c in SHOWN)
    body = []
    for rec in table.to_dict("records"):
        rec = {**rec, "p": _tests(rec), "rcp": " / ".join(_cell(c, rec[c]) for c in ("rcp_factor", "reference_rcp_factor")),
               "cost": _cost_cell(rec)}
        cls = page.verdict_class(rec["verdict"])
        cells = "".join(f"<td class='{'num' if c in NUMERIC else ''}{' ' + cls if c == 'verdict' else ''}'>"
                        f"{rec[c] if c in ('p', 'rcp', 'cost') else _cell(c, rec[c])}</td>" for c in SHOWN)
        body.append(f"<tr data-benchmark='{html.escape(rec['benchmark'])}'>{cells}</tr>")
        config = _cell("config", rec["config"]) + (" <b class='generated'>generated by mlrepro plan</b>"
                                                   if rec["config_generated"] else "")
        notes = [f"vs {html.escape(str(rec['reference']))}" if rec.get("reference") else "",
                 html.escape(str(rec["why"])) if rec.get("why") else "", f"config {config}" if rec["config"] else "",
                 f"effective training time {goodput.percent(rec['effective_training_time'])}"
                 if isinstance(rec.get("effective_training_time"), float) and not pd.isna(rec["effective_training_time"])
                 else ""]
        body.append(f"<tr class='detail'><td></td><td colspan='{len(SHOWN) - 1}' class='why'>"
                    f"{'; '.join(n for n in notes if n)}</td></tr>")
    reproduced = int((table["verdict"] == "reproduced").sum()) if len(table) else 0
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>" + page.VIEWPORT + "<title>mlrepro final report</title>"
            f"<style>{page.CSS}</style></head><body>"
            "<h1>mlrepro final report</h1>"
            f"<div class='scroll'><table id='verdicts-table'><tr>{head}</tr>{''.join(body)}</table></div>"
            f"<p id='overview'>{len(table)} benchmark and system pairs, {reproduced} reproduced.</p>"
            + _cost_total(table) +
            "<p class='small'>Each row compares your runs with the reference scored by the same scorer: for an MLPerf "
            "benchmark, the submitter's published result logs at the implementation's pinned commit; for a miniature, "
            "reference runs from a known-good machine if it ships them, otherwise its seeds among themselves. "
            f"Test: {html.escape(METHOD)}; a test differs at p &lt; {page.ALPHA}. Difference = (yours - reference) / "
            "reference. The same table is in summary.csv and summary.json.</p>"
            + side_by_side.section(same_model) + "</body></html>\n")


def _cost_cell(rec: dict) -> str:
    spent, planned = rec.get("spent_gpu_hours"), rec.get("planned_gpu_hours")
    if spent is None or (isinstance(spent, float) and pd.isna(spent)):
        return "-"
    text = f"{spent:.3g} / {planned:.3g} {html.escape(str(rec.get('cost_unit') or 'GPU-hours'))}" if planned else f"{spent:.3g}"
    stop = rec.get("early_stop")
    if isinstance(stop, str) and stop:
        text += f"<div class='bad small'>{html.escape(stop)}</div>"
    return text


def _cost_total(table: pd.DataFrame) -> str:
    """The whole reproduction's cost, per unit (GPU-hours and a miniature's CPU-hours are not added up)."""
    if not len(table) or "spent_gpu_hours" not in table or table["spent_gpu_hours"].isna().all():
        return ""
    parts = []
    for unit, rows in table.groupby(table["cost_unit"].fillna("GPU-hours")):
        parts.append(f"{rows['spent_gpu_hours'].sum():.3g} {html.escape(str(unit))} spent of "
                     f"{rows['planned_gpu_hours'].sum():.3g} planned (upper bound), "
                     f"{rows['failed_gpu_hours'].sum():.3g} of it on failed attempts")
    return f"<p id='cost-total'>Cost in total: {'; '.join(parts)}.</p>"


def write_final_report(verdict_files: Iterable[str | os.PathLike], out_html: str | os.PathLike,
                       out_csv: str | os.PathLike, out_json: str | os.PathLike,
                       same_model: Sequence[tuple[str, Sequence[dict]]] = ()) -> pd.DataFrame:
    """The final report; `same_model` as render_final's."""
    out_html = Path(out_html)
    table = summary_table(list(verdict_files), out_html.parent)
    atomic_write_text(out_csv, table.to_csv(index=False))
    atomic_write_text(out_json, table.to_json(orient="records", indent=2))
    atomic_write_text(out_html, render_final(table, same_model))
    return table
