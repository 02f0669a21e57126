"""The final report: every configured benchmark and system in one table, with its verdict.

results/summary.csv and results/summary.json are the table (pandas); results/report.html
opens with it, each row linking to that benchmark's own report.html.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Iterable

import pandas as pd

from mlrepro.util.fsutil import atomic_write_text
from mlrepro.scoring.report import _CSS
from mlrepro.scoring.verdict import METHOD

COLUMNS = ["benchmark", "system", "reference", "reference_kind", "score_minutes", "reference_score_minutes",
           "difference_pct", "p_time_to_train", "p_time_per_sample", "p_samples_to_converge", "samples_to_converge",
           "reference_samples_to_converge", "rcp_factor", "reference_rcp_factor", "valid", "verdict", "why", "report"]


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
    }


def summary_table(verdict_files: Iterable[str | os.PathLike], out_dir: str | os.PathLike) -> pd.DataFrame:
    """The table of all verdicts; each row's report link is relative to `out_dir`."""
    rows = []
    for path in map(Path, verdict_files):
        report = os.path.relpath(path.parent / "report.html", Path(out_dir))
        rows.append(row(json.loads(path.read_text()), report))
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if column == "report":
        return f"<a href='{html.escape(str(value))}'>report</a>"
    if column == "difference_pct":
        return f"{value:+.1f}%"
    if column.startswith("p_"):
        return f"{value:.3g}"
    if isinstance(value, float):
        return f"{value:.6f}" if "rcp" in column else f"{value:.3f}" if "minutes" in column else f"{value:.1f}"
    return html.escape(str(value))


SHOWN = ["benchmark", "system", "verdict", "score_minutes", "reference_score_minutes", "difference_pct", "reference",
         "p", "rcp", "why", "report"]
# Column headings of the page (the CSV and JSON keep the column names).
LABELS = {"score_minutes": "your score (min)", "reference_score_minutes": "reference score (min)",
          "difference_pct": "difference", "p": "p: time to train / per sample / samples",
          "rcp": "RCP factor: yours / reference"}


def _joined(rec: dict, columns: list[str]) -> str:
    return " / ".join(_cell(c, rec[c]) for c in columns)


def render_final(table: pd.DataFrame) -> str:
    """The final report page: the verdict table first, then how verdicts are reached."""
    head = "".join(f"<th>{html.escape(LABELS.get(c, c.replace('_', ' ')))}</th>" for c in SHOWN)
    body = []
    for rec in table.to_dict("records"):
        cls = "ok" if rec["verdict"] in ("reproduced", "seeds only") else "bad"
        rec = {**rec, "p": _joined(rec, ["p_time_to_train", "p_time_per_sample", "p_samples_to_converge"]),
               "rcp": _joined(rec, ["rcp_factor", "reference_rcp_factor"])}
        classes = {"verdict": cls, "why": "why"}
        cells = "".join(f"<td class='{classes.get(c, '')}'>{rec[c] if c in ('p', 'rcp') else _cell(c, rec[c])}</td>"
                        for c in SHOWN)
        body.append(f"<tr data-benchmark='{html.escape(rec['benchmark'])}'>{cells}</tr>")
    reproduced = int((table["verdict"] == "reproduced").sum()) if len(table) else 0
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>mlrepro final report</title>"
            f"<style>{_CSS}body{{max-width:none;margin:1.5em}} td.why{{min-width:14em}} table{{font-size:.85em}}</style></head><body>"
            "<h1>mlrepro final report</h1>"
            f"<table id='verdicts-table'><tr>{head}</tr>{''.join(body)}</table>"
            f"<p id='overview'>{len(table)} benchmark and system pairs, {reproduced} reproduced.</p>"
            "<p class='small'>Each row compares your runs with the reference scored by the same scorer: for an MLPerf "
            "benchmark, the submitter's published result logs at the implementation's pinned commit; for a miniature, "
            "reference runs from a known-good machine if it ships them, otherwise its seeds among themselves. "
            f"Test: {html.escape(METHOD)}. Difference = (yours - reference) / reference. "
            "The same table is in summary.csv and summary.json.</p></body></html>\n")


def write_final_report(verdict_files: Iterable[str | os.PathLike], out_html: str | os.PathLike,
                       out_csv: str | os.PathLike, out_json: str | os.PathLike) -> pd.DataFrame:
    out_html = Path(out_html)
    table = summary_table(list(verdict_files), out_html.parent)
    atomic_write_text(out_csv, table.to_csv(index=False))
    atomic_write_text(out_json, table.to_json(orient="records", indent=2))
    atomic_write_text(out_html, render_final(table))
    return table
