"""How long `snakemake -n` of mini_lora with many seeds takes, against a bare workflow of the same shape.

    python benchmarks/dag_speed.py [--seeds 400] [--pairs 5]

The bare workflow (written into a temporary folder) has touch rules of the same shape:
data -> train_seed (one per seed) -> score_seed (one per seed) -> score. mlrepro's is a copy of
this checkout's workflow whose mini_lora benchmark lists the same seeds. The two run alternately
(`pairs` times each, same flags), so both see the same machine; the table gives every pair, the
medians and their ratio (issue 22's acceptance: at most 1.3x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from workspace import make_workspace  # noqa: E402

BARE = """\
SEEDS = list(range(1, {seeds} + 1))


rule score:
    input:
        expand("results/b/seed_{{seed}}/run.json", seed=SEEDS),
    output:
        "results/b/score.json",
    shell:
        "touch {{output}}"


rule score_seed:
    input:
        "results/b/seed_{{seed}}/mllog.txt",
    output:
        "results/b/seed_{{seed}}/run.json",
    shell:
        "touch {{output}}"


rule train_seed:
    input:
        "resources/b/data/manifest.json",
    output:
        "results/b/seed_{{seed}}/mllog.txt",
    shell:
        "touch {{output}}"


rule data:
    output:
        "resources/b/data/manifest.json",
    shell:
        "touch {{output}}"
"""

FLAGS = ("-n", "--cores", "2", "--quiet", "all")


def timed(folder: Path, target: str, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", target, *FLAGS], cwd=folder, env=env,
                          capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"snakemake -n in {folder} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare"
        bare.mkdir()
        (bare / "Snakefile").write_text(BARE.format(seeds=args.seeds))
        ws = make_workspace(Path(tmp) / "ws")
        bench_file = ws / "config" / "benchmarks" / "mini_lora.yaml"
        bench = yaml.safe_load(bench_file.read_text())
        bench["seeds"] = list(range(1, args.seeds + 1))
        bench_file.write_text(yaml.safe_dump(bench, sort_keys=False))
        runs = {"bare": [], "mlrepro": []}
        timed(bare, "results/b/score.json", env)  # warm the file system cache and the imports
        timed(ws, "results/mini_lora/score.json", env)
        rows = []
        for i in range(args.pairs):
            runs["bare"].append(timed(bare, "results/b/score.json", env))
            runs["mlrepro"].append(timed(ws, "results/mini_lora/score.json", env))
            rows.append((f"pair {i + 1}", f"{runs['bare'][-1]:.2f} s", f"{runs['mlrepro'][-1]:.2f} s",
                         f"{runs['mlrepro'][-1] / runs['bare'][-1]:.2f}x"))
    bare_m, ml_m = statistics.median(runs["bare"]), statistics.median(runs["mlrepro"])
    rows.append(("median", f"{bare_m:.2f} s", f"{ml_m:.2f} s", f"{ml_m / bare_m:.2f}x"))
    header = (f"snakemake -n, {args.seeds} seeds", "bare workflow", "mlrepro mini_lora", "ratio")
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(4)]
    for r in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
