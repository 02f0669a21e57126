"""The tables of issue 23's device runs, in Markdown, from the records device/multigpu_run.sh brings back.

    python3 device/multigpu_tables.py RECORDS_DIR > docs/measurements/multigpu/tables.md

RECORDS_DIR holds the unpacked node.tgz, train.tgz, four.tgz or final.tgz (folders node/, train/, four/, final/). Loss curves
of the GPT-126M layouts are held to a +-3% band around the TP1 DP1 run's curve (the band of
implementations/megatron_gpt/reference/gpt_126m_loss.csv, whose curve is for a 27,169-token vocabulary:
the corpus stages' miniature has 554), drawn by mlrepro.pretrain.loss_band.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from mlrepro.baseline import megatron as baseline_megatron
from mlrepro.plan.layout import Layout
from mlrepro.scoring import loss_band

MIB = 1 << 20
BUSBW_REF = {16 * MIB: 216, 256 * MIB: 299, 1024 * MIB: 322, 4096 * MIB: 343}  # 2x H200, DESIGN.md section 8
BAND = 0.03


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def preflights(rec: Path) -> list[tuple[str, dict]]:
    found = []
    for name, path in [(f"{p.parent.name}/{p.stem}", p) for p in sorted(rec.glob("*/preflight*_*.json"))] + [
            ("degraded (matmul loop on GPU1)", next(iter(rec.glob("*/degraded/preflight.json")), Path("-"))),
            ("baseline's preflight, 2 GPUs", next(iter(rec.glob("*/bl2/results/preflight/*/preflight.json")), Path("-"))),
            ("baseline's preflight, 4 GPUs", next(iter((rec / "four" / "bl4").glob("results/preflight/*/preflight.json")), Path("-")))]:
        doc = load(path)
        if doc:
            found.append((name, doc))
    return found


def preflight_tables(rec: Path) -> list[str]:
    out = ["| preflight | s | GPU | bf16 matmul (steady) | burst (first 10) | SM MHz / W under load | copy TB/s | verdict | why (not pass) |",
           "|---|---|---|---|---|---|---|---|---|"]
    counts = {"pass": 0, "warn": 0, "fail": 0}
    busbw = ["| preflight | GPUs | " + " | ".join(f"{s >> 20} MiB (ref {r})" for s, r in BUSBW_REF.items()) + " | verdict |",
             "|---|---|" + "---|" * len(BUSBW_REF) + "---|"]
    for name, doc in preflights(rec):
        host = doc["hosts"][0]
        for g in host["gpus"]:
            load_s = f"{g.get('under_load_sm_clock_mhz', '?')} / {g.get('under_load_power_w', '?')}"
            out.append(f"| {name} | {doc['seconds']} | GPU{g['index']} {g['name']} | {g.get('matmul_bf16_tflops')} | "
                       f"{g.get('matmul_bf16_burst_tflops')} | {load_s} | {g.get('copy_tbps')} | {g['verdict']} | "
                       f"{g['why'] if g['verdict'] != 'pass' else ''} |")
            if not name.startswith("degraded"):
                counts[g["verdict"]] = counts.get(g["verdict"], 0) + 1
        by = {a["bytes"]: a["busbw_gbps"] for a in host.get("allreduce", [])}
        check = next((c for c in host["checks"] if c["name"] == "allreduce_busbw"), {})
        if by:
            cells = [f"{by[s]:.0f} ({100 * by[s] / r:.0f}%)" if s in by else "-" for s, r in BUSBW_REF.items()]
            busbw.append(f"| {name} | {len(host['gpus'])} | " + " | ".join(cells) + f" | {check.get('verdict')} |")
    return out + ["", f"GPU verdicts over the healthy preflights: {counts}", ""] + busbw


def run_of(rec: Path, lane: str) -> dict | None:
    return next((load(p) for p in (rec / lane).glob("results/gpt_126m*/seed_1/run.json")), None)


def curve_band(curve: list) -> loss_band.Band:
    it = np.array([c[0] for c in curve], float)
    loss = np.array([c[1] for c in curve], float)
    return loss_band.Band(it, loss, loss * (1 - BAND), loss * (1 + BAND))


def gpt126m_table(rec: Path) -> list[str]:
    lanes = [(f"{part}/{lane}", lay) for part in ("node", "final", "four")
             for lane, lay in (("gm1", Layout(mbs=8, ga=2)), ("gtp2", Layout(tp=2, mbs=8, ga=2)),
                               ("gdp2", Layout(dp=2, mbs=8, ga=1)), ("g4", Layout(dp=4, mbs=4, ga=1)))]
    runs = [(lane, lay, run_of(rec, lane)) for lane, lay in lanes if (rec / lane).is_dir()]
    base = next((r for lane, _, r in runs if lane.endswith("/gm1") and r), None)
    band = curve_band(base["curve"]) if base else None
    out = ["| layout | GPUs | tokens/s | TFLOP/s/GPU (Megatron's) | MFU of 989 | scaling efficiency | peak memory measured / predicted (GiB) | val loss (last) | loss curve vs TP1 DP1 +-3% |",
           "|---|---|---|---|---|---|---|---|---|"]
    for lane, lay, r in runs:
        if not r:
            out.append(f"| {lane} | | not run | | | | | | |")
            continue
        t = r["throughput"]
        eff = (t["tokens_per_s"] / (t["gpus"] * base["throughput"]["tokens_per_s"])) if base else None
        pred = baseline_megatron.predicted("gpt-126m", lay, "sdpa", 640).total / 2 ** 30
        check = loss_band.check(r["curve"], band) if band else None
        val = r["evals"][-1][1] if r.get("evals") else None
        out.append(f"| TP{lay.tp} PP1 DP{lay.dp} MBS{lay.mbs} GA{lay.ga} | {t['gpus']} | {t['tokens_per_s']:,.0f} | "
                   f"{t['tflops_per_gpu']} | {100 * t['mfu']:.1f}% | {'' if eff is None else f'{100 * eff:.0f}%'} | "
                   f"{t['max_allocated_gib']:.2f} / {pred:.2f} | {val} | {check.message() if check else ''} |")
    return out


def chain_tables(rec: Path) -> list[str]:
    state = next((load(p) for p in rec.glob("*/chain/results/*/seed_1/segments.json")), None)
    kill = next((load(p) for p in rec.glob("*/kill.json")), None)
    out = ["| segment | from step | to step | status | train s | wall s | val loss | error |", "|---|---|---|---|---|---|---|---|"]
    for s in (state or {}).get("segments", []):
        out.append(f"| {s['index']} | {s['from_step']} | {s['to_step']} | {s['status']} | {s.get('train_s')} | "
                   f"{s.get('wall_s')} | {s.get('val_loss')} | {(s.get('error') or '')[:80]} |")
    finals = {}
    for lane in ("chain", "ref1", "ref2"):
        r = next((run_of(rec, f"{part}/{lane}") for part in ("train", "final") if run_of(rec, f"{part}/{lane}")), None)
        if r and r.get("evals"):
            finals[lane] = r["evals"][-1][1]
    out += ["", f"kill: {kill}", f"final validation loss: {finals}"]
    if "chain" in finals and "ref1" in finals:
        refs = [v for k, v in finals.items() if k != "chain"]
        out.append(f"chain - uninterrupted: {finals['chain'] - refs[0]:+.6f}"
                   + (f"; uninterrupted run-to-run: {abs(refs[1] - refs[0]):.6f}" if len(refs) > 1 else ""))
    return out


def baseline_tables(rec: Path) -> list[str]:
    out = ["| GPUs | workload | layout | MBS | GBS | iteration s (measured) | predicted s | error | TFLOP/s/GPU | MFU | peak mem GiB / predicted | error |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for part, lane in (("node", "bl2"), ("final", "bl2"), ("four", "bl4")):
        doc = next((load(p) for p in (rec / part / lane).glob("results/baseline/*/baseline.json")), None)
        for r in (doc or {}).get("runs", []):
            if r.get("workload") == "megatron":
                lay = f"TP{r.get('tp')} PP{r.get('pp')} DP{r.get('dp')}" + (f" VPP{r['vpp']}" if (r.get("vpp") or 1) > 1 else "") \
                      + (" (planner's choice)" if r.get("planner_choice") else "")
            else:
                lay = "probe (1 GPU)"
            gpus = (r.get("tp") or 1) * (r.get("pp") or 1) * (r.get("dp") or 1)
            mfu = r.get("mfu")
            out.append(f"| {gpus} | {r.get('workload')} | {lay} | {r.get('mbs')} | {r.get('gbs')} | {r.get('iter_time_s')} | "
                       f"{r.get('predicted_iter_time_s', '')} | {r.get('iter_time_error_pct', '')} | {r.get('tflops_per_gpu')} | "
                       f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | {r.get('peak_mem_gib')} / {r.get('predicted_mem_gib')} | "
                       f"{r.get('mem_error_pct')} | " + (f"error: {r['error'][:100]}" if r.get("error") else ""))
    return out


def main(rec: Path) -> None:
    for title, lines in (("Preflight", preflight_tables(rec)), ("GPT-126M through the workflow", gpt126m_table(rec)),
                         ("Chained GPT-126M seed", chain_tables(rec)), ("The baseline checklist's baseline and the planner", baseline_tables(rec))):
        print(f"## {title}\n")
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
