"""The baseline checklist's "Baseline Performance Report": the table in HTML and Markdown (pandas) and a plot (matplotlib).

Measured rows of both workloads (a: Megatron-LM, b: the probe) share the table; rows not measured
(not applicable, or an error) are listed under it with their reason.
"""

from __future__ import annotations

from pathlib import Path

from mlrepro.util.fsutil import atomic_write_text

COLUMNS = {
    "workload": "Workload", "layout": "Layout",
    "model": "Model", "precision": "Precision Setting", "attention": "Attention", "mbs": "MBS", "gbs": "GBS",
    "iter_time_s": "Iteration Time (s)", "samples_per_s": "Throughput (samples/s)",
    "tflops_per_gpu": "Achieved TFLOPs (per GPU)", "mfu_pct": "MFU (%)", "peak_mem_gib": "Peak Memory (GiB/GPU)",
    "predicted_mem_gib": "Predicted Memory (GiB)", "mem_error_pct": "Memory Error (%)",
    "predicted_iter_time_s": "Predicted Iteration Time (s)", "iter_time_error_pct": "Iteration Time Error (%)",
    "gpu_busy_pct": "GPU Busy (% of a traced step)",
}


def busy_pct(profile) -> float | None:
    """Rank 0's GPU busy share of its traced steps (baseline: megatron: profile), in %."""
    share = ((profile if isinstance(profile, dict) else {}).get("rank0") or {}).get("gpu_busy_share")
    return round(100 * share, 1) if isinstance(share, (int, float)) else None


def layout_name(r) -> str:
    vpp = getattr(r, "vpp", None)
    extra = f" VPP{int(vpp)}" if isinstance(vpp, (int, float)) and vpp == vpp and vpp > 1 else ""
    return f"TP{r.tp} PP{r.pp} DP{r.dp}{extra}" + (" (planner's choice)" if getattr(r, "planner_choice", False) is True else "")


def table(doc: dict):
    import pandas as pd

    df = pd.DataFrame(doc["runs"])
    df["mfu_pct"] = (100 * df["mfu"].astype(float)).round(1)
    if {"tp", "pp", "dp"} <= set(df):
        df["layout"] = [layout_name(r) for r in df.itertuples()]
    if "profile" in df:
        df["gpu_busy_pct"] = [busy_pct(p) for p in df["profile"]]
    peak = df["peak_tflops"].iloc[0] if "peak_tflops" in df else None
    cols = [c for c in COLUMNS if c in df]
    return df[cols].rename(columns={**COLUMNS, "mfu_pct": f"MFU (% of {peak:g} TFLOP/s)" if peak else "MFU (%)"})


def header(doc: dict) -> str:
    r0 = doc["runs"][0] if doc["runs"] else {}
    return (f"Baseline Performance Report: {doc['system']} ({r0.get('gpu', '?')}); seq {r0.get('seq')}; "
            f"FLOPs: {doc.get('flops_formula', '')}")


def measured(doc: dict) -> tuple[list[dict], list[str]]:
    """(the rows measured, one line per row that was not: what it is and why)."""
    rows, skipped = [], []
    for r in doc["runs"]:
        why = r.get("not_applicable") or r.get("error")
        if why:
            skipped.append(f"{r.get('workload', 'probe')} {r.get('model')} {r.get('precision')}: {why}")
        else:
            rows.append(r)
    return rows, skipped


def write(doc: dict, md_path: Path, html_path: Path, plot_path: Path) -> None:
    """The report of baseline.json's document (every row; those not measured are listed with why)."""
    import html

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, skipped = measured(doc)
    notes_md = "".join(f"- {line}\n" for line in skipped)
    notes_md = f"\nNot measured:\n\n{notes_md}" if skipped else ""
    notes_html = "".join(f"<li>{html.escape(line)}</li>" for line in skipped)
    notes_html = f"<p>Not measured:</p><ul>{notes_html}</ul>" if skipped else ""
    doc = {**doc, "runs": rows}
    if not rows:
        why = doc.get("why", "no run succeeded (see baseline.json)")
        atomic_write_text(md_path, f"# Baseline Performance Report: {doc['system']}\n\n{why}\n{notes_md}")
        atomic_write_text(html_path, f"<html><body><h1>Baseline Performance Report</h1><p>{html.escape(why)}</p>"
                                     f"{notes_html}</body></html>\n")
        fig = plt.figure(figsize=(6, 1))
        fig.text(0.5, 0.5, why, ha="center")
        fig.savefig(plot_path)
        plt.close(fig)
        return
    df = table(doc)
    title = header(doc)
    atomic_write_text(md_path, f"# {title}\n\n" + df.to_markdown(index=False) + "\n" + notes_md)
    atomic_write_text(html_path, f"<html><body><h1>Baseline Performance Report</h1><p>{html.escape(title)}</p>"
                                 + df.to_html(index=False) + notes_html + "</body></html>\n")
    runs = doc["runs"]
    labels = [f"{r.get('workload', 'probe')} {r['model']} {r['precision']} {r.get('attention', '')} mbs{r['mbs']}"
              for r in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    a.barh(labels, [100 * (r["mfu"] or 0) for r in runs])
    a.set_xlabel("MFU (%)")
    a.axvline(55, ls="--", c="k", lw=1)
    y = range(len(runs))
    b.barh([i - 0.2 for i in y], [r["peak_mem_gib"] for r in runs], height=0.4, label="measured")
    b.barh([i + 0.2 for i in y], [r["predicted_mem_gib"] for r in runs], height=0.4, label="predicted (plan.memory)")
    b.set_yticks(list(y), labels)
    b.set_xlabel("peak memory (GiB)")
    b.legend()
    fig.tight_layout()
    fig.savefig(plot_path)
    plt.close(fig)
