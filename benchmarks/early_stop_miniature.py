"""The early stop on the CPU miniature (issue 24): a system slowed on purpose against a healthy one.

Each scenario runs the real workflow in a scratch copy of the repository
(`snakemake --profile profiles/local results/mini_lora/score.json --config system=<name>`) with the
opt-in early stop on, and reads back score.json: the seeds run, the verdict, the cost planned
(upper bound at the wall-time, expected at the reference's run times) and spent, and what the stop
saved. The slowed system is config/systems/local-slow.yaml (`cores: 1`: both ranks of a seed on one
core); the healthy one is config/systems/local.yaml with the same early_stop block.

    .venv/bin/python benchmarks/early_stop_miniature.py                 # both scenarios
    .venv/bin/python benchmarks/early_stop_miniature.py --only slow
    .venv/bin/python benchmarks/early_stop_miniature.py --reference-here   # against this machine's own ten seeds
    .venv/bin/python benchmarks/early_stop_miniature.py --replay DIR    # the policy over finished seeds in DIR

Seeds take about half a minute each on an idle 2-core machine; on a loaded one many times that, and
the verdict against the shipped reference (a 2-vCPU VM) follows the machine's speed, not only the knob:
a VM lent on slower hosts than that one is "not reproduced" however healthy. --reference-here first runs
the ten seeds on `local` without the early stop, and the two scenarios then take those logs as the
reference (the known-good machine is this one, as it is now).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
COPIED = ("Snakefile", "workflow", "config", "profiles", "implementations")
EARLY_STOP = "early_stop: {confidence: 0.99, min_seeds: 3}\n"


def workspace(dest: Path, reference: Path | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = ROOT / name
        (shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy2(src, dest / name))
    if reference is not None:  # this machine's seeds, as the shipped reference's folder holds them
        here = dest / "implementations" / "mini_lora" / "reference_here"
        shutil.copytree(dest / "implementations" / "mini_lora" / "reference", here,
                        ignore=shutil.ignore_patterns("result_*.txt"))
        for i, log in enumerate(sorted(reference.glob("seed_*/mllog.txt"))):
            shutil.copy2(log, here / f"result_{i}.txt")
        bench = dest / "config" / "benchmarks" / "mini_lora.yaml"
        bench.write_text(bench.read_text().replace("runs: implementations/mini_lora/reference\n",
                                                   "runs: implementations/mini_lora/reference_here\n"))
    healthy = (dest / "config" / "systems" / "local.yaml").read_text().replace("name: local\n", "name: local-healthy\n")
    (dest / "config" / "systems" / "local-healthy.yaml").write_text(healthy + EARLY_STOP)
    return dest


def run(system: str, scratch: Path, reference: Path | None = None, label: str | None = None) -> dict:
    ws = workspace(scratch / (label or system), reference)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--cores", "2",
                           "results/mini_lora/score.json", "--config", f"system={system}"],
                          cwd=ws, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{system}: snakemake failed:\n{proc.stderr[-3000:]}")
    return summarise(ws / "results" / "mini_lora", label or system, wall)


def summarise(folder: Path, system: str, wall: float | None) -> dict:
    score = json.loads((folder / "score.json").read_text())
    verdict = json.loads((folder / "verdict.json").read_text())
    c, stop = score["cost"], score.get("early_stop") or {}
    plan = c.get("planned") or {}
    ran = sum(1 for f in folder.glob("seed_*") if (f / "mllog.txt").is_file() and not (f / "stopped.json").exists())
    return {"system": system, "seeds run": f"{ran} of {plan.get('seeds')}", "verdict": verdict["verdict"],
            "stopped": stop.get("message", "no"), "planned (upper)": plan.get("upper_bound_gpu_hours"),
            "planned (expected)": plan.get("expected_gpu_hours"), "spent": c["gpu_hours"],
            "saved": stop.get("saved_gpu_hours"), "unit": c.get("unit"), "wall s": wall}


def replay(folder: Path, system: str, reference: Path | None = None) -> None:
    """The stop decision after each finished seed of a finished reproduction, in seed order, against the
    shipped reference or the logs in `reference` (e.g. another reproduction's seeds on the same machine)."""
    from mlrepro import config
    from mlrepro.scoring import early_stop, running_verdict as rv, score
    from mlrepro.scoring import rules as scoring_rules

    bench = config.load_benchmark(ROOT, "mini_lora")
    rules = scoring_rules.for_benchmark(bench)
    if reference is None:
        ref = early_stop.reference_runs(ROOT, bench, rules)
    else:
        ref = rv.runs_of([score.score_run(p, rules, run_compliance=False)
                          for p in sorted(reference.glob("seed_*/mllog.txt")) if p.stat().st_size])
    runs = []
    for seed in sorted(int(p.parent.name.split("_")[1]) for p in folder.glob("seed_*/mllog.txt")):
        runs.append(score.score_run(folder / f"seed_{seed}" / "mllog.txt", rules, run_compliance=False, seed=seed))
        seen = rv.runs_of(runs)
        d = rv.should_stop(seen, ref, bench.required_runs, rules.max_failed_runs, rv.EarlyStop())
        p = rv.probability_reproduced(seen, ref, bench.required_runs, rules.max_failed_runs)
        print(f"| {system} | after seed {seed} ({len(seen)} seen) | {runs[-1]['minutes']:.3f} min | "
              f"P(reproduced) {p:.3f} | {'STOP' if d['stop'] else 'go on'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("slow", "healthy"))
    ap.add_argument("--scratch", default="/tmp/mlrepro-early-stop", help="where the scratch copies go")
    ap.add_argument("--replay", type=Path, help="a results/mini_lora folder of finished seeds")
    ap.add_argument("--reference", type=Path, help="with --replay: a results/mini_lora folder to compare with")
    ap.add_argument("--reference-here", action="store_true",
                    help="first run the ten seeds here (system local, no early stop) and use them as the reference")
    args = ap.parse_args()
    if args.replay:
        print("| folder | look | run time | P(reproduced) | decision |\n| --- | --- | --- | --- | --- |")
        replay(args.replay, args.replay.parent.parent.name, args.reference)
        return 0
    scratch = Path(args.scratch)
    rows, reference = [], None
    if args.reference_here:
        rows.append(run("local", scratch, label="local-reference"))
        reference = scratch / "local-reference" / "results" / "mini_lora"
    rows += [run(s, scratch, reference) for s in (["local-slow"] if args.only != "healthy" else [])
             + (["local-healthy"] if args.only != "slow" else [])]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    for r in rows:
        if r["planned (upper)"] and r["saved"] is not None:
            print(f"{r['system']}: spent {r['spent'] / r['planned (upper)']:.0%} of the planned upper bound; the "
                  f"seeds not run would have cost {r['saved'] / (r['spent'] + r['saved']):.0%} of the projected "
                  "total (spent + saved, at the mean cost of the seeds that ran)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
