"""Where the time of a reproduction goes: training, or mlrepro and Snakemake around it.

    python benchmarks/orchestration.py dry-run                 # `snakemake -n` of the miniature, repeated
    python benchmarks/orchestration.py seeds results/mini_lora # seed figures of a finished results folder
    python benchmarks/orchestration.py slurm                   # run the 10 seeds through the local Slurm
                                                               # cluster (mlrepro cluster up) and report

Each prints a table. The reference in every ratio is measured in the same run: the seeds'
own run times (run_start to run_stop, from their MLLOG) against the wall time around them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from workspace import make_workspace, run_snakemake


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def iso(ts: str) -> float:
    return dt.datetime.fromisoformat(ts).timestamp()


def dry_run(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp) / "ws")
        run_snakemake(ws, "--profile", "profiles/local", "-n")  # warm the file system cache
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run_snakemake(ws, "--profile", "profiles/local", "results/mini_lora/score.json", "-n")
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import snakemake.cli"], check=True)
        startup = time.perf_counter() - start
    print(table([
        ("snakemake -n (24 jobs), median", f"{statistics.median(times):.2f} s over {repeats} runs (min {min(times):.2f}, max {max(times):.2f})"),
        ("of which importing snakemake", f"{startup:.2f} s ({startup / statistics.median(times):.0%})"),
    ]))


def seeds(results: Path) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(results.glob("seed_*/run.json"))]
    jobs = [json.loads(p.read_text()) for p in sorted(results.glob("seed_*/job.json"))]
    run_s = [r["minutes"] * 60 for r in runs if r.get("minutes") is not None]
    rows = [
        ("seeds", f"{len(runs)} ({sum(r['converged'] for r in runs)} converged)"),
        ("run time per seed (run_start..run_stop)", f"{min(run_s):.1f} - {max(run_s):.1f} s, sum {sum(run_s):.1f} s"),
    ]
    slurm_jobs = [j for j in jobs if j.get("scheduler") == "slurm" and j.get("collected") and j.get("end")]
    if slurm_jobs:
        first = min(iso(j["submitted"]) for j in slurm_jobs if j.get("submitted"))
        last = max(iso(j["collected"]) for j in slurm_jobs)
        e2e = last - first
        elapsed = [j["elapsed_s"] for j in slurm_jobs if j.get("elapsed_s") is not None]
        # Slurm prints End= in the cluster's local time without a zone; this machine's zone applies.
        delays = [iso(j["collected"]) - dt.datetime.fromisoformat(j["end"]).astimezone().timestamp() for j in slurm_jobs]
        rows += [
            ("Slurm job time per seed (sacct Elapsed)", f"{min(elapsed)} - {max(elapsed)} s, sum {sum(elapsed)} s"),
            ("first sbatch -> last seed collected", f"{e2e:.1f} s"),
            ("  / sum of run times", f"{e2e / sum(run_s):.2f}x"),
            ("  / sum of Slurm job times", f"{e2e / sum(elapsed):.2f}x"),
            ("job end -> workflow notices (median, max)", f"{statistics.median(delays):.1f} s, {max(delays):.1f} s"),
        ]
    print(table(rows))


def slurm() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp) / "ws")
        args = ("--profile", "profiles/slurm", "--config", "system=local-slurm",
                "--slurm-init-seconds-before-status-checks", "1")
        run_snakemake(ws, *args, "resources/mini_lora/checkpoint/manifest.json", "resources/mini_lora/data/manifest.json")
        start = time.perf_counter()
        run_snakemake(ws, *args, "results/mini_lora/score.json")
        wall = time.perf_counter() - start
        print(table([("snakemake wall time, seeds + scores", f"{wall:.1f} s")]))
        seeds(ws / "results" / "mini_lora")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("dry-run").add_argument("--repeats", type=int, default=5)
    sub.add_parser("seeds").add_argument("results", type=Path)
    sub.add_parser("slurm")
    args = parser.parse_args()
    {"dry-run": lambda: dry_run(args.repeats), "seeds": lambda: seeds(args.results), "slurm": slurm}[args.what]()


if __name__ == "__main__":
    main()
