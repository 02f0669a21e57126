"""The injected-failure miniature on the local Slurm cluster (issue 33): measured against predicted
effective training time.

mini_gpt's seeds run through the workflow (`snakemake --profile profiles/slurm results/mini_gpt/score.json
--config system=local-slurm`) in a scratch copy of the repository, with the benchmark's
`inject_failures: {mtbf_seconds: M, seed: S}`: each running job is scancelled after an exponential time
of mean M. The measured side is score.json's `goodput` (mlrepro.scoring.goodput): the effective training
time per seed and in all, the lost time by cause, the restart and checkpoint costs and the checkpoint
interval the run used. The predicted side is the failure model's (mlrepro.plan.goodput, given the MTBF,
the interval and the measured costs): `predicted()` below is the one place it plugs in.

    .venv/bin/python benchmarks/goodput_injected.py                       # 3 seeds, MTBF 45 s
    .venv/bin/python benchmarks/goodput_injected.py --mtbf 60 --seeds 1-5 --inject-seed 2
    .venv/bin/python benchmarks/goodput_injected.py --measured DIR        # read a finished results/mini_gpt

Needs the local cluster (`mlrepro cluster up`, as root). A seed takes 1-3 minutes on an idle 2-core
machine with failures every 45 s; the corpus stages run once first, here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
COPIED = ("Snakefile", "workflow", "config", "profiles", "implementations")


def workspace(dest: Path, mtbf: float, inject_seed: int, seeds: list[int]) -> Path:
    from mlrepro.corpus import minicorpus

    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = ROOT / name
        (shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy2(src, dest / name))
    bench = dest / "config" / "benchmarks" / "mini_gpt.yaml"
    spec = yaml.safe_load(bench.read_text())
    spec.update(seeds=seeds, required_runs=len(seeds), inject_failures={"mtbf_seconds": mtbf, "seed": inject_seed})
    bench.write_text(yaml.safe_dump(spec))
    server = minicorpus.serve(minicorpus.make_mini_corpus(dest / "corpus_server"))
    try:
        corpus = dest / "config" / "corpora" / "mini_corpus.yaml"
        corpus.write_text(corpus.read_text().replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
        snakemake(dest, "--profile", "profiles/local", "resources/corpora/mini_corpus/data_prefix.json")
    finally:
        server.shutdown()
    return dest


def snakemake(ws: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=ws, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def measured(folder: Path) -> dict:
    """The goodput of a finished results/mini_gpt, as its score.json has it (the same function, from the
    seeds' records, so that a folder scored by an earlier version reads as this one measures), with the
    MTBF its benchmark injected."""
    from mlrepro.scoring import goodput

    plan = json.loads(next(folder.glob("seed_*/plan.json")).read_text())
    return {**goodput.benchmark_goodput(folder), "mtbf_s": (plan.get("inject_failures") or {}).get("mtbf_seconds")}


def predicted(m: dict) -> dict | None:
    """The failure model's effective training time for what was measured (mlrepro.plan.goodput's simulator at
    the injected MTBF and the seeds' measured restart and checkpoint costs and interval): {"effective", "method"}."""
    from mlrepro.plan import goodput as model

    return model.measured_prediction(m, m["mtbf_s"])


def report(m: dict, p: dict | None) -> str:
    from mlrepro.scoring import goodput

    lines = [f"MTBF injected: {m['mtbf_s']} s; attempts {m['attempts']} ({m['failures']} ended by a failure)",
             f"measured effective training time: {goodput.percent(m['effective'])} "
             f"({m['productive_s']:.1f} s productive of {m['total_s']:.1f} s; queued {m['queue_s'] or 0:.1f} s apart)",
             f"predicted: {goodput.percent(p['effective']) + ' (' + p['method'] + ')' if p else 'none (a figure the model needs was not measured)'}",
             f"checkpoint interval: {m['checkpoint_interval_steps']} steps x {m['step_s']:.3f} s a step",
             f"restart cost {m['restart_cost_s'] if m['restart_cost_s'] is None else round(m['restart_cost_s'], 2)} s, "
             f"checkpoint write {m['checkpoint_cost_s'] if m['checkpoint_cost_s'] is None else round(m['checkpoint_cost_s'], 3)} s",
             "| seed | effective | productive (s) | total (s) | " + " | ".join(goodput.CAUSES.values()) + " | queued (s) |",
             "|" + " --- |" * (5 + len(goodput.CAUSES))]
    for name, s in [*sorted(m["seeds"].items(), key=lambda kv: int(kv[0])), ("all", m)]:
        lines.append(f"| {name} | {goodput.percent(s['effective'])} | {s['productive_s']:.1f} | {s['total_s']:.1f} | "
                     + " | ".join(f"{s['lost_s'][c]:.1f}" for c in goodput.CAUSES) + f" | {s['queue_s'] or 0:.1f} |")
    if p:
        lines.append(f"measured - predicted: {100 * (m['effective'] - p['effective']):+.1f} points (acceptance: within ±5)")
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtbf", type=float, default=45.0, help="mean seconds between injected failures")
    ap.add_argument("--inject-seed", type=int, default=0, help="the failure injection's generator seed")
    ap.add_argument("--seeds", default="1-3", help="mini_gpt's seeds, e.g. 1-3")
    ap.add_argument("--scratch", default="/tmp/mlrepro-goodput", help="where the scratch copy goes")
    ap.add_argument("--measured", type=Path, help="a finished results/mini_gpt folder: read it, run nothing")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    folder = args.measured
    if folder is None:
        scratch = Path(args.scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        ws = workspace(scratch, args.mtbf, args.inject_seed, parse_seeds(args.seeds))
        started = time.monotonic()
        snakemake(ws, "--profile", "profiles/slurm", "--config", "system=local-slurm",
                  "--slurm-init-seconds-before-status-checks", "1", "--", "results/mini_gpt/score.json")
        print(f"workflow: {time.monotonic() - started:.0f} s")
        folder = ws / "results" / "mini_gpt"
    m = measured(folder)
    p = predicted(m)
    print(report(m, p))
    if args.json:
        args.json.write_text(json.dumps({"measured": {k: v for k, v in m.items() if k != "seeds"} | {
            "seeds": {s: {k: v for k, v in g.items() if k != "per_attempt"} for s, g in m["seeds"].items()}},
            "predicted": p}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
