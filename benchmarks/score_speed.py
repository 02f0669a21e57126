"""Time scoring against the official tools, and check that the numbers agree.

    python benchmarks/score_speed.py [--repeat 3]
        a synthetic 10-run llama2_70b_lora folder: `mlrepro score DIR --benchmark ...` against
        the official checkers run by hand (compliance_checker on each log, then rcp_checker).

    python benchmarks/score_speed.py --tree /work/data/v5 [--ruleset 5.0.0] [--jobs 1] [--folders] [--baseline SRC]
        a whole results repository (e.g. mlcommons/training_results_v5.0: the folder holding the
        submitters): `mlrepro score TREE` against `python -m mlperf_logging.result_summarizer
        'TREE/{*}' training 5.0.0` (the summarizer's form for every submitter, one process), each
        run once as the subprocess a user would type. Then every benchmark folder's result is
        compared (time to train within 0.001 min; GBS, samples to converge, RCP verdict and the
        scaling factor applied); exit status 1 if any differs.
        --folders also times per-folder mode over the same tree: `mlrepro score DIR --benchmark B` on
        every results/<system>/<benchmark> folder, one process calling the CLI's entry point.
        --baseline SRC times the same with another checkout's sources (e.g. main before a change:
        `git worktree add /tmp/base <commit>`, SRC=/tmp/base/src) in the same run, one after the other.

Prints a table of wall-clock seconds and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import logs_factory as lf  # noqa: E402
from mlrepro.scoring import score as scoring  # noqa: E402
from mlrepro.scoring.rules import rules_for  # noqa: E402


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _child_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# Per-folder mode over a tree, in one process of the sources under test (PYTHONPATH): prints
# {"wall": s, "cpu": s, "folders": n, "scores": {folder: minutes}} as JSON.
_FOLDERS_WORKER = r"""
import contextlib, io, json, resource, sys, tempfile, time
from pathlib import Path
from mlrepro import cli
root, ruleset = Path(sys.argv[1]), sys.argv[2]
alias = {"mask": "maskrcnn"}
folders = [b for org in sorted(root.iterdir()) if (org / "systems").exists() and (org / "results").is_dir()
           for system in sorted(p for p in (org / "results").iterdir() if p.is_dir())
           for b in sorted(p for p in system.iterdir() if p.is_dir()) if any(b.glob("result_*.txt"))]
scores = {}
t, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
with tempfile.TemporaryDirectory() as tmp:
    for i, folder in enumerate(folders):
        out = Path(tmp) / f"{i}.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main(["score", str(folder), "--benchmark", alias.get(folder.name, folder.name),
                          "--ruleset", ruleset, "--json", str(out)])
            except Exception:
                pass
        scores[str(folder)] = json.loads(out.read_text()).get("score_minutes") if out.is_file() else None
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": time.perf_counter() - t, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                  "folders": len(folders), "scores": scores}))
"""


def folders_timing(root: Path, ruleset: str, src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.run([sys.executable, "-c", _FOLDERS_WORKER, str(root), ruleset], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"per-folder timing with {src} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tree(root: Path, ruleset: str, jobs: int, folders: bool = False, baseline: Path | None = None) -> int:
    import shutil

    load = os.getloadavg()[0]

    from mlrepro.scoring import summarizer_compare

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="score-speed-") as tmp:
        tmp = Path(tmp)
        # The summarizer rewrites scaling.json in the folders it reads: give it a copy (not timed).
        copy = tmp / "copy"
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".*"))
        official_csv = tmp / "official.csv"
        t, c = time.perf_counter(), _child_cpu()
        proc = subprocess.run([sys.executable, "-m", "mlperf_logging.result_summarizer", f"{copy}/{{*}}", "training",
                               ruleset, "--csv", str(official_csv)], cwd=tmp, env=env, capture_output=True, text=True)
        t_official, c_official = time.perf_counter() - t, _child_cpu() - c
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
            return 2
        ours_csv = tmp / "ours.csv"
        timed = {}  # label -> (wall, cpu) of mlrepro score TREE
        for label, src in ([("baseline", baseline)] if baseline else []) + [("this checkout", ROOT / "src")]:
            out_csv = ours_csv if label == "this checkout" else tmp / "baseline.csv"
            t, c = time.perf_counter(), _child_cpu()
            proc = subprocess.run([sys.executable, "-m", "mlrepro", "score", str(root), "--ruleset", ruleset,
                                   "--csv", str(out_csv), "--jobs", str(jobs)],
                                  cwd=tmp, env=dict(env, PYTHONPATH=str(src)), capture_output=True, text=True)
            timed[label] = (time.perf_counter() - t, _child_cpu() - c)
            if proc.returncode not in (0, 1):
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                return 2
        t_ours, c_ours = timed["this checkout"]
        per_folder = {}
        if folders:
            for label, src in ([("baseline", baseline)] if baseline else []) + [("this checkout", ROOT / "src")]:
                per_folder[label] = folders_timing(root, ruleset, src)
        import pandas as pd

        ours = pd.read_csv(ours_csv)
        official = summarizer_compare.summarizer_rows(tmp / "official_detailed.csv")
        both = summarizer_compare.compare_with_summarizer(ours, official)
    folders = ours["folder"].nunique()
    submitters = ours["submitter"].nunique()
    print(f"{root}: {submitters} submitters, {folders} benchmark folders, MLPerf training {ruleset}")
    # CPU seconds (user + system, the process and its children) do not depend on what else runs
    # on the machine; wall-clock seconds do.
    print(f"load average before: {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'method':<66} {'wall s':>7} {'CPU s':>7} {'wall x':>7} {'CPU x':>7}")
    print(f"{'python -m mlperf_logging.result_summarizer TREE/{*} training ' + ruleset:<66} {t_official:7.1f} "
          f"{c_official:7.1f} {1.0:6.1f}x {1.0:6.1f}x")
    for label, (w, c) in timed.items():
        name = f"mlrepro score TREE{f' --jobs {jobs}' if jobs > 1 else ''} ({label})"
        print(f"{name:<66} {w:7.1f} {c:7.1f} {t_official / w:6.1f}x {c_official / c:6.1f}x")
    for label, r in per_folder.items():
        name = f"mlrepro score DIR --benchmark B, {r['folders']} folders ({label})"
        print(f"{name:<66} {r['wall']:7.1f} {r['cpu']:7.1f} {t_official / r['wall']:6.1f}x "
              f"{c_official / r['cpu']:6.1f}x")
    if "baseline" in timed:
        (wb, cb), (wo, co) = timed["baseline"], timed["this checkout"]
        print(f"tree mode, this checkout against the baseline: wall {wb / wo:.2f}x, CPU {cb / co:.2f}x as fast")
    if "baseline" in per_folder:
        b, o = per_folder["baseline"], per_folder["this checkout"]
        print(f"per-folder mode, this checkout against the baseline: wall {b['wall'] / o['wall']:.2f}x, "
              f"CPU {b['cpu'] / o['cpu']:.2f}x as fast")
    same = int(both["same"].sum())
    scored = int(both["time_to_train"].notna().sum())
    print(f"results compared: {len(both)} (with a score: {scored}); equal to the summarizer: {same}; "
          f"largest difference {both['abs_diff_min'].max():.2e} min")
    for _, r in both[~both["same"]].iterrows():
        print(f"  DIFFERS: {r['details_url']} {r['benchmark']}: ours {r['time_to_train']} "
              f"official {r['time_to_train_official']} ({r['_merge']})")
    per_bench = both.groupby("benchmark")["same"].agg(["sum", "count"])
    print("per benchmark (equal/compared): " + ", ".join(f"{b} {int(s)}/{int(c)}"
                                                        for b, (s, c) in per_bench.iterrows()))
    return 0 if same == len(both) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tree", type=Path, help="a results repository: the folder holding the submitters")
    ap.add_argument("--ruleset", default="5.0.0")
    ap.add_argument("--jobs", type=int, default=1, help="processes for mlrepro score TREE")
    ap.add_argument("--folders", action="store_true", help="with --tree: also time per-folder mode on every folder")
    ap.add_argument("--baseline", type=Path, help="with --tree: also time another checkout's src/ (before/after)")
    args = ap.parse_args()
    if args.tree:
        return tree(args.tree, args.ruleset, args.jobs, args.folders, args.baseline)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="score-speed-") as tmp:
        tmp = Path(tmp)
        folder = tmp / "llama2_70b_lora"
        logs = lf.write_runs(folder, lf.ten_runs())
        work = tmp / "cwd"  # the official tools write their .log files into the cwd
        work.mkdir()

        def run(cmd):
            subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)

        def by_hand():
            for log in logs:
                run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                     "--ruleset", "5.0.0", str(log)])
            run([sys.executable, "-m", "mlperf_logging.rcp_checker", str(folder), "--rcp_usage", "training",
                 "--rcp_version", "5.0.0"])

        def cli():
            run([sys.executable, "-m", "mlrepro", "score", str(folder), "--benchmark", "llama2_70b_lora"])

        rules = rules_for("llama2_70b_lora")

        def in_process():
            scoring.score_runs(logs, rules)

        rows = [("official checkers by hand (10 x compliance_checker + rcp_checker)", best_of(args.repeat, by_hand)),
                ("mlrepro score DIR (CLI, one process)", best_of(args.repeat, cli)),
                ("mlrepro.scoring.score.score_runs (in-process, warm)", best_of(args.repeat, in_process))]
    ref = rows[0][1]
    print(f"{'method':<70} {'seconds':>8} {'vs by hand':>11}")
    for name, secs in rows:
        print(f"{name:<70} {secs:8.2f} {ref / secs:10.1f}x")
    print("(mlrepro score also computes the olympic mean and the RCP scaling factor; by hand gives verdicts only)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
