"""How long `snakemake -n` of mini_lora with many seeds takes, against a bare workflow of the same shape.

    python benchmarks/dag_speed.py [--seeds 400] [--pairs 5]

The bare workflow (written into a temporary folder) has touch rules of the same shape:
data -> train_seed (one per seed) -> score_seed (one per seed) -> score. mlrepro's is a copy of
this checkout's workflow whose mini_lora benchmark lists the same seeds. The two run alternately
(`pairs` times each, same flags), so both see the same machine; the table gives every pair, the
medians and their ratio (issue 22's acceptance: at most 1.3x). The CPU time each run took (user +
system, of snakemake and its children) is given beside: on a machine others load, it moves far less
than the wall time does.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(folder: Path, target: str, env: dict) -> tuple[float, float]:
    """Wall and CPU seconds of one `snakemake -n`."""
    start, cpu = time.perf_counter(), cpu_seconds()
    proc = subprocess.run([sys.executable, "-m", "snakemake", target, *FLAGS], cwd=folder, env=env,
                          capture_output=True, text=True)
    took = time.perf_counter() - start, cpu_seconds() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"snakemake -n in {folder} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return took


def row(label: str, bare: float, ml: float, bare_cpu: float, ml_cpu: float) -> tuple[str, ...]:
    return (label, f"{bare:.2f} s", f"{ml:.2f} s", f"{ml / bare:.2f}x",
            f"{bare_cpu:.2f} s", f"{ml_cpu:.2f} s", f"{ml_cpu / bare_cpu:.2f}x")


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
        cpu = {"bare": [], "mlrepro": []}
        timed(bare, "results/b/score.json", env)  # warm the file system cache and the imports
        timed(ws, "results/mini_lora/score.json", env)
        rows = []
        for i in range(args.pairs):
            for name, folder, target in (("bare", bare, "results/b/score.json"),
                                         ("mlrepro", ws, "results/mini_lora/score.json")):
                wall, used = timed(folder, target, env)
                runs[name].append(wall)
                cpu[name].append(used)
            rows.append(row(f"pair {i + 1}", runs["bare"][-1], runs["mlrepro"][-1], cpu["bare"][-1], cpu["mlrepro"][-1]))
    rows.append(row("median", *(statistics.median(x[n]) for x in (runs, cpu) for n in ("bare", "mlrepro"))))
    header = (f"snakemake -n, {args.seeds} seeds", "bare workflow", "mlrepro mini_lora", "ratio",
              "CPU bare", "CPU mlrepro", "CPU ratio")
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
