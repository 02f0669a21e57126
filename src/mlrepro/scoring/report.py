"""One self-contained HTML page for a scored benchmark.

Score and validity at the top, a table of runs, the evaluation metric against
samples for every seed with the target line, time-to-train per seed, and the
compliance and RCP verdicts. Plots are inline SVG (matplotlib, Agg backend),
so the page needs nothing beside it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from mlrepro.paths import SeedPaths
from mlrepro.scoring import page, tfevents
from mlrepro.scoring.page import CSS, VIEWPORT, escape, number
from mlrepro.scoring.plots import inline_svg, plt
from mlrepro.util.fsutil import atomic_write_text
from mlrepro.scoring.mllog import parse_log

logger = logging.getLogger(__name__)

def _evals_by_run(score: dict, logs: Mapping[Any, Any] | Sequence[Any] | None) -> list[tuple[str, list]]:
    metric = score["target"]["metric"]
    runs = score.get("runs") or []
    paths: dict[Any, Any] = {}
    if isinstance(logs, Mapping):
        paths = dict(logs)
    elif logs:
        paths = {i: p for i, p in enumerate(logs)}
    out = []
    if paths:
        run_of = {str(r.get("file")): r for r in runs}
        for label, path in paths.items():
            log = parse_log(path)
            pts = [(r.metadata.get("samples_count"), r.value) for r in log.all(metric)]
            pts = [(s, v) for s, v in pts if isinstance(s, (int, float)) and isinstance(v, (int, float))]
            run = run_of.get(str(path)) or {}
            pts = _trainer_validation(Path(path), run) or pts or _run_evals(run)
            seed = log.value("seed", run.get("seed", label))
            out.append((f"seed {seed}", pts))
    else:
        for r in runs:
            out.append((f"seed {r.get('seed')}", _run_evals(r)))
    return out


def _run_evals(run: dict) -> list:
    return [(s, v) for s, v in (run.get("evals") or []) if s is not None and v is not None]


def _trainer_validation(log_path: Path, run: dict) -> list:
    """The validation loss by samples from the event files the trainer wrote beside the seed's log (Megatron-LM's
    --tensorboard-dir: every evaluation it made, where its log may have lost lines); [] where it wrote none."""
    curves = tfevents.trainer_curves(SeedPaths(log_path.parent).tensorboard)
    if curves is None:
        return []
    for why in curves.skipped:
        logger.warning("the report's curve leaves out part of an event file: %s", why)
    return tfevents.validation_vs_samples(curves, run.get("global_batch_size"))


def _eval_plot(score: dict, series: list[tuple[str, list]], measures: str | None = None) -> str:
    t = score["target"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for label, pts in series:
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=label)
    if t["value"] is not None:  # a target of two numbers (FID and CLIP) has no one line to draw
        ax.axhline(t["value"], color="red", linestyle="--", linewidth=1.2,
                   label=f"target {t['direction']} {t['value']:g}")
    xs_all = [x for _, pts in series for x, _ in pts]
    if xs_all:
        ax.set_xlim(0, max(xs_all) * 1.03)
        # The first evals of a run from scratch sit far above the rest; scaled to them, the approach to
        # the target (what decides time to train) would be a flat line at the bottom. The axis spans the
        # evals after the first tenth of the samples, and the target; earlier ones run off the top.
        late = [y for _, pts in series for x, y in pts if x >= 0.1 * max(xs_all)] or [y for _, pts in series for _, y in pts]
        bounds = late + ([t["value"]] if t["value"] is not None else [])
        low, high = min(bounds), max(bounds)
        pad = 0.08 * (high - low or abs(high) or 1)
        ax.set_ylim(low - pad, high + pad)
    ax.set_xlabel("samples")
    ax.set_ylabel(f"{t['metric']} ({page.measures({**t, 'measures': measures}, score.get('mlperf_benchmark'))})")
    ax.set_title(f"{t['metric']} against samples, every seed")
    ax.grid(alpha=.3)
    ax.legend(fontsize=7, ncol=2)
    return inline_svg(fig)


def _time_plot(score: dict) -> str:
    runs = [r for r in score.get("runs") or [] if r.get("minutes") is not None]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [str(r.get("seed")) for r in runs]
    colors = ["#4a8" if r.get("counted") else "#d55" for r in runs]
    ax.bar(range(len(runs)), [r["minutes"] for r in runs], color=colors)
    ax.set_xticks(range(len(runs)), labels, rotation=45, fontsize=8)
    if score.get("olympic_minutes") is not None:
        ax.axhline(score["olympic_minutes"], color="#333", linestyle="--", linewidth=1,
                   label=f"olympic mean {score['olympic_minutes']:.3f} min")
        ax.legend(fontsize=8)
    ax.set_xlabel("seed (red: not counted)")
    ax.set_ylabel("time to train (minutes)")
    ax.set_title("time to train per seed")
    ax.grid(axis="y", alpha=.3)
    return inline_svg(fig)


def plots(score: dict, logs: Mapping[Any, Any] | Sequence[Any] | None = None,
          measures: str | None = None) -> dict[str, str]:
    """The report's figures as SVG text: `convergence` (metric vs samples) and `time_to_train`."""
    return {"convergence": _eval_plot(score, _evals_by_run(score, logs), measures), "time_to_train": _time_plot(score)}


def render_report(score: dict, logs: Mapping[Any, Any] | Sequence[Any] | None = None,
                  figures: Mapping[str, str] | None = None, verdict_html: str | None = None,
                  measures: str | None = None) -> str:
    """The report page as a string (`figures` from plots(), made from `logs` when not given).

    `verdict_html` (mlrepro.scoring.verdict_report.render_section) opens the page: how it compares with the
    reference, what the page is read for. `measures` says what the metric measures where its name
    does not (the benchmark's target.measures).
    """
    figures = figures or plots(score, logs, measures)
    valid = bool(score.get("valid"))
    t = score["target"]
    rules = (f"MLPerf Training {score.get('ruleset')} ({score.get('mlperf_benchmark')})"
             if score.get("mlperf_benchmark") else "no MLPerf ruleset: generic checks")
    what = page.measures({**t, "measures": measures}, score.get("mlperf_benchmark"))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>{VIEWPORT}<title>{escape(score['benchmark'])} "
             f"score</title><style>{CSS}</style></head><body>",
             f"<h1>{escape(score['benchmark'])}</h1><div class='small' id='target'>{escape(rules)}; target "
             f"{escape(page.target_text(t))}; {escape(t['metric'])} is the {escape(what)}; "
             f"{escape(score.get('required_runs'))} runs required</div>"]
    if verdict_html:
        parts.append(verdict_html)
    parts.append(f"<div class='verdict {'valid' if valid else 'invalid'}' id='score'>score "
                 f"<b>{number(score.get('score_minutes'))}</b> minutes &mdash; {'VALID' if valid else 'NOT VALID'}"
                 f"<div class='small'>olympic mean {number(score.get('olympic_minutes'))} min &times; RCP scaling "
                 f"{page.factor(score['rcp'].get('scaling_factor'))}</div></div>")
    if score.get("reasons"):
        parts.append("<h3>Why not valid</h3><ul>" + "".join(f"<li class='bad'>{escape(r)}</li>" for r in score["reasons"])
                     + "</ul>")
    parts.append("<h2>Runs</h2><div class='scroll'><table id='runs'><tr><th>seed</th><th class='num'>minutes</th>"
                 "<th>status</th><th class='num'>samples to converge</th><th>compliance</th><th>counted</th>"
                 "<th>reasons / problems</th><th>file</th></tr>")
    for r in score.get("runs") or []:
        comp = r.get("compliance") or {}
        comp_s, comp_cls = page.compliance(r, score)
        # flags: a pretraining run's loss leaving its reference band (mlrepro.scoring.megatron_score)
        notes = [*(f"FLAG: {f}" for f in r.get("flags") or []), *(r.get("reasons") or []),
                 *(comp.get("reasons") or [] if comp.get("checked") else []),
                 *(r.get("problems") or [])]
        parts.append(
            f"<tr><td>{escape(r.get('seed'))}</td><td class='num'>{number(r.get('minutes'))}</td>"
            f"<td>{escape(r.get('status'))}</td><td class='num'>{page.samples(r.get('samples_to_converge'))}</td>"
            f"<td class='{comp_cls}'>{escape(comp_s)}</td><td class='{'ok' if r.get('counted') else 'bad'}'>"
            f"{'yes' if r.get('counted') else 'no'}</td><td class='why'>{'<br>'.join(escape(n) for n in notes[:8])}</td>"
            f"<td class='small'>{escape('/'.join(Path(str(r.get('file'))).parts[-2:]))}</td></tr>")
    parts.append("</table></div>")
    parts.append(_segments_html(score.get("runs") or []))
    parts.append(f"<h2>Convergence</h2><figure id='eval-plot'>{figures['convergence']}</figure>")
    parts.append(f"<h2>Time to train</h2><figure id='time-plot'>{figures['time_to_train']}</figure>")
    rcp = score["rcp"]
    rcp_s = "not checked" if not rcp.get("checked") else ("PASS" if rcp.get("pass") else "FAIL")
    n_comp = [r for r in score.get("runs") or [] if (r.get("compliance") or {}).get("checked")]
    comp_pass = sum(1 for r in n_comp if r["compliance"].get("pass"))
    miniature = not score.get("ruleset") and not score.get("mlperf_benchmark")
    compliance_s = ("no ruleset (miniature): the compliance checker does not apply" if miniature
                    else f"{comp_pass} of {len(n_comp)} checked runs pass")
    parts.append("<h2>Verdicts</h2><div class='scroll'><table id='verdicts'>"
                 f"<tr><th>compliance checker</th><td class='{'na' if miniature else ''}'>{compliance_s}</td></tr>"
                 f"<tr><th>RCP check</th><td>{rcp_s}: {escape(rcp.get('reason'))}</td></tr>"
                 f"<tr><th>RCP mean / submission mean</th><td>{page.samples(rcp.get('rcp_mean'))} / "
                 f"{page.samples(rcp.get('submission_mean'))} samples</td></tr>"
                 f"<tr><th>scaling factor</th><td>{page.factor(rcp.get('scaling_factor'))}</td></tr></table></div>")
    parts.append("</body></html>\n")
    return "".join(parts)


# A segment that ended so is the chain at work, not a failure (an attempt's class, or an older record's status).
_FINE = {"finished", "saved_at_limit", "resume", "success"}


def _segments_html(runs: list[dict]) -> str:
    """Seeds run as a chain of time-limited jobs (mlrepro.launch.chain): one row per job."""
    chained = [r for r in runs if len(r.get("segments") or []) > 1]
    if not chained:
        return ""

    def lost(s: dict) -> str:
        if not s.get("lost_steps"):
            return "0" if "lost_steps" in s else ""
        return f"{escape(s['lost_steps'])} steps, {number(s.get('lost_s'), '.1f')} s"

    def said(s: dict) -> str:
        # The attempt's class (mlrepro.launch.attempt) in words; an older record has only its status.
        return escape(str(s.get("class") or s.get("status") or "").replace("_", " "))

    def error(s: dict) -> str:
        last = (s.get("error_lines") or [None])[-1]
        return escape(" | ".join(str(x) for x in (s.get("error"), last) if x))

    rows = "".join(
        f"<tr><td>{escape(r.get('seed'))}</td><td>{escape(s.get('index'))}</td><td>{escape(s.get('from_step'))} &rarr; "
        f"{escape(s.get('to_step'))}</td><td>{number(s.get('train_s'), '.1f')}</td><td>{number(s.get('wall_s'), '.1f')}</td>"
        f"<td>{number(s.get('gpu_s'), '.0f')}</td>"
        f"<td class='{'ok' if (s.get('class') or s.get('status')) in _FINE else 'bad'}'>{said(s)}</td>"
        f"<td>{lost(s)}</td><td>{number(s.get('val_loss'), '.4f')}</td><td class='small'>{error(s)}</td></tr>"
        for r in chained for s in r["segments"])
    return ("<h2>Segments</h2><div class='small'>Seeds longer than the job limit ran as chained jobs, each resuming "
            "from the last checkpoint; time to train adds up the segments' training time. Each job's class says how "
            "it ended; work lost is what it trained past its last checkpoint.</div>"
            "<div class='scroll'><table id='segments'><tr><th>seed</th><th>job</th><th>steps</th><th>training s</th>"
            "<th>wall s</th><th>GPU s</th><th>ended</th><th>work lost</th><th>val loss</th><th>error</th></tr>"
            f"{rows}</table></div>")


def write_report(score: dict, logs: Mapping[Any, Any] | Sequence[Any] | None, out_html: str | os.PathLike,
                 plot_dir: str | os.PathLike | None = None, verdict_html: str | None = None,
                 measures: str | None = None) -> Path:
    """Write the report for `score` (a score_runs result) to `out_html` atomically.

    `logs` maps seed → log path (or lists log paths) for the convergence plot;
    with None the evaluations stored in each run of `score` are used. With `plot_dir`,
    the figures are also written there as convergence.svg and time_to_train.svg.
    """
    figures = plots(score, logs, measures)
    out = Path(out_html)
    atomic_write_text(out, render_report(score, figures=figures, verdict_html=verdict_html, measures=measures))
    if plot_dir is not None:
        for name, svg in figures.items():
            atomic_write_text(Path(plot_dir) / f"{name}.svg", svg)
    return out


# ---------------------------------------------------------------- submission trees

_TREE_VIEW = [("submitter", "submitter"), ("system", "system"), ("accelerators_count", "accelerators"),
              ("division", "division"), ("benchmark", "benchmark"), ("time_to_train", "minutes"),
              ("rcp_scaling_factor", "scaling applied"), ("rcp_factor", "RCP factor of the runs"), ("RCP", "RCP"),
              ("runs", "runs used / found"), ("valid", "valid"), ("why", "reasons and notes")]


def tree_table_html(table) -> str:
    """An HTML ``<table id='tree'>`` of a tree_score table (one row per system and benchmark),
    for a page of its own (write_tree_report) or to embed in another report."""
    def cell(row, key: str) -> str:
        v = row.get(key)
        if key == "runs":
            return f"{escape(row.get('runs_used'))} / {escape(row.get('runs_found'))}"
        if key == "why":
            items = [x for x in (row.get("reasons"), row.get("run_notes")) if isinstance(x, str) and x]
            return "<br>".join(escape(x) for x in items)
        if key == "valid":
            return "yes" if v is True or v == 1 else "no"
        if isinstance(v, float):
            return "-" if v != v else number(v, ".3f" if key == "time_to_train" else ".6g")
        return escape(v)

    head = "".join(f"<th>{escape(label)}</th>" for _, label in _TREE_VIEW)
    body = []
    for row in table.to_dict("records"):
        ok = row.get("valid") is True or row.get("valid") == 1
        body.append(f"<tr class='{'ok' if ok else 'bad'}'>"
                    + "".join(f"<td>{cell(row, key)}</td>" for key, _ in _TREE_VIEW) + "</tr>")
    return f"<div class='scroll'><table id='tree'><tr>{head}</tr>{''.join(body)}</table></div>"


def write_tree_report(table, out_html: str | os.PathLike, title: str = "MLPerf results") -> Path:
    """A self-contained page with the tree table, written atomically."""
    scored = int(table["time_to_train"].notna().sum()) if len(table) else 0
    text = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>{VIEWPORT}<title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1><div class='small'>{len(table)} benchmark "
            f"folders, {scored} with a score</div>{tree_table_html(table)}</body></html>\n")
    out = Path(out_html)
    atomic_write_text(out, text)
    return out
