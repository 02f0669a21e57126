"""Does `mlrepro score` give MLCommons' numbers? Every benchmark folder of a results round, three ways.

    python benchmarks/score_agreement.py /work/data/v4.0 [--ruleset 4.0.0] [--cache DIR] [--modes folder,tree]

For a results repository (e.g. mlcommons/training_results_v4.0: the folder holding the submitters):

  official     `python -m mlperf_logging.result_summarizer SUBMITTER training RULESET --csv ...`, once per
               submitter, on a copy (it rewrites scaling.json); its *_detailed.csv is the reference. Where
               the summarizer crashes on a submitter (v4.0 smc-ac-power: ZeroDivisionError in its power
               step) it is run again with the power step off (`_has_power` -> False) and the table says so.
  tree         `mlrepro score TREE` (tree mode), in this process.
  folder       `mlrepro score DIR --benchmark B --ruleset RULESET --json ...` (per-folder mode) on each
               results/<system>/<benchmark> folder, in this process (the CLI's own entry point).

A folder matches when both have no score, or the times to train differ by at most --tolerance minutes
(default 0: the same number, as both multiply the same olympic mean by the same factor). Prints one table per round: matched/total per benchmark for both modes, then every folder
that differs and why. The summarizer's tables are kept in --cache (it is the slow part): a second run
reuses them. Exit status 0 when every folder matches in every mode asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# The summarizer with its power step off, for submitters where that step crashes.
_NO_POWER = ("import sys; import mlperf_logging.result_summarizer.result_summarizer as r; "
             "r._has_power = lambda folder: False; sys.argv[0] = 'result_summarizer'; r.main()")


def submitters(root: Path) -> list[Path]:
    """result_summarizer's organisations: folders holding both systems/ and results/."""
    return [d for d in sorted(root.iterdir()) if d.is_dir() and (d / "systems").exists() and (d / "results").exists()]


def benchmark_folders(root: Path) -> list[Path]:
    """Every results/<system>/<benchmark> folder holding a result_*.txt (what both modes score)."""
    out = []
    for org in submitters(root):
        for system in sorted(p for p in (org / "results").iterdir() if p.is_dir()):
            out += [b for b in sorted(p for p in system.iterdir() if p.is_dir()) if any(b.glob("result_*.txt"))]
    return out


def _key(folder: Path) -> tuple[str, str, str]:
    return folder.parents[2].name, folder.parent.name, folder.name


def _official_submitter(org: Path, ruleset: str, cache: Path) -> dict:
    """Run the summarizer on a copy of one submitter; {"csv": detailed csv or None, "note": ...}."""
    done = cache / f"{org.name}.json"
    if done.is_file():
        return json.loads(done.read_text())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    info = {"csv": None, "note": "", "seconds": None}
    for attempt, prefix in (("as published", ["-m", "mlperf_logging.result_summarizer"]),
                            ("power step off", ["-c", _NO_POWER])):
        with tempfile.TemporaryDirectory(prefix="score-agreement-") as tmp:
            tmp = Path(tmp)
            copy = tmp / org.name  # a fresh copy each time: a crashed run may have rewritten scaling.json
            shutil.copytree(org, copy, ignore=shutil.ignore_patterns(".*"))
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, *prefix, str(copy), "training", ruleset, "--csv",
                                   str(tmp / "official.csv")], cwd=tmp, env=env, capture_output=True, text=True)
            info["seconds"] = (info["seconds"] or 0.0) + time.perf_counter() - t
            detailed = tmp / "official_detailed.csv"
            if proc.returncode == 0:
                if detailed.is_file():
                    keep = cache / f"{org.name}_detailed.csv"
                    shutil.copyfile(detailed, keep)
                    info["csv"] = str(keep)
                if attempt != "as published":
                    info["note"] = f"summarizer crashed as published; {attempt}"
                break
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            info["note"] = f"summarizer crashed ({last[:160]})"
    cache.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(info))
    return info


def official(root: Path, ruleset: str, cache: Path) -> tuple[dict, dict, float]:
    """{(org, system, benchmark): {time_to_train, Energy, ...}}, {org: note}, summarizer seconds."""
    import pandas as pd

    cache.mkdir(parents=True, exist_ok=True)
    rows, notes, seconds = {}, {}, 0.0
    for org in submitters(root):
        info = _official_submitter(org, ruleset, cache)
        seconds += info.get("seconds") or 0.0
        if info["note"]:
            notes[org.name] = info["note"]
        if not info["csv"]:
            continue
        wide = pd.read_csv(info["csv"])
        benches = sorted({c.split(":", 1)[0] for c in wide.columns if ":" in c})
        for _, r in wide.iterrows():
            system = str(r["details_url"]).rsplit("/", 1)[-1].removesuffix(".json")
            for b in benches:
                vals = {m: r.get(f"{b}:{m}") for m in ("time_to_train", "Energy", "RCP", "rcp_scaling_factor",
                                                        "samples_to_converge", "GBS")}
                vals = {m: (None if isinstance(v, float) and math.isnan(v) else v) for m, v in vals.items()}
                if vals["time_to_train"] is None and vals["RCP"] is None:
                    continue
                rows[(org.name, system, b)] = vals
    return rows, notes, seconds


def tree_mode(root: Path, ruleset: str) -> tuple[dict, float]:
    from mlrepro.scoring import tree_score

    t = time.perf_counter()
    table, _ = tree_score.score_tree([root], ruleset=ruleset)
    seconds = time.perf_counter() - t
    out = {}
    for r in table.itertuples():
        if isinstance(r.folder, str) and r.benchmark:
            ttt = r.time_to_train if r.time_to_train == r.time_to_train else None
            energy = r.Energy if isinstance(r.Energy, float) and r.Energy == r.Energy else None
            out[_key(Path(r.folder))] = {"time_to_train": ttt, "Energy": energy, "note": r.reasons}
    return out, seconds


def folder_mode(folders: list[Path], ruleset: str, benchmark_of) -> tuple[dict, float]:
    """`mlrepro score DIR --benchmark B` on each folder, through the CLI's entry point."""
    from mlrepro import cli

    out = {}
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="score-agreement-") as tmp:
        for i, folder in enumerate(folders):
            js = Path(tmp) / f"{i}.json"
            bench = benchmark_of(folder)
            stdout, stderr = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    rc = cli.main(["score", str(folder), "--benchmark", bench, "--ruleset", ruleset,
                                   "--json", str(js)])
            except Exception as exc:  # a crash is a result too
                out[_key(folder)] = {"time_to_train": None, "Energy": None,
                                     "note": f"crashed: {type(exc).__name__}: {exc}"}
                continue
            if not js.is_file():
                out[_key(folder)] = {"time_to_train": None, "Energy": None,
                                     "note": f"refused (exit {rc}): {stderr.getvalue().strip()[:200]}"}
                continue
            result = json.loads(js.read_text())
            energy = result.get("energy")
            out[_key(folder)] = {"time_to_train": result.get("score_minutes"),
                                 "Energy": energy.get("value") if isinstance(energy, dict) else energy,
                                 "note": "; ".join(result.get("reasons") or [])}
    return out, time.perf_counter() - t


def engine_mode(folders: list[Path], ruleset: str, benchmark_of) -> tuple[dict, float]:
    """mlrepro.scoring.engine.score_logs on each folder (what both modes are built on), in this process."""
    from mlrepro.scoring import engine, official

    out = {}
    t = time.perf_counter()
    with official.official_tools():
        for folder in folders:
            row = engine.score_logs(engine.result_files(folder), benchmark=benchmark_of(folder), ruleset=ruleset,
                                    folder=folder)
            out[_key(folder)] = {"time_to_train": row["time_to_train"], "Energy": row["Energy"],
                                 "note": "; ".join(row["reasons"])}
    return out, time.perf_counter() - t


def _close(a, b, tol: float) -> bool:
    if a is None and b is None:
        return True
    return a is not None and b is not None and abs(float(a) - float(b)) <= tol


def compare(keys, official_rows, mode_rows, tol) -> dict:
    """{key: (same, ours, theirs, note)}"""
    out = {}
    for k in keys:
        ref = official_rows.get(k, {}).get("time_to_train")
        mine = mode_rows.get(k, {})
        out[k] = (_close(mine.get("time_to_train"), ref, tol), mine.get("time_to_train"), ref, mine.get("note", ""))
    return out


def _largest(cmp: dict) -> float:
    gaps = [abs(float(mine) - float(theirs)) for _, mine, theirs, _ in cmp.values()
            if mine is not None and theirs is not None]
    return max(gaps, default=0.0)


def _ruleset_of(root: Path) -> str:
    m = re.search(r"v?(\d+)\.(\d+)", root.resolve().name)
    if not m:
        raise SystemExit(f"cannot tell the ruleset from {root.name!r}: give --ruleset")
    return f"{m.group(1)}.{m.group(2)}.0"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="+", type=Path, help="results repositories (folders holding the submitters)")
    ap.add_argument("--ruleset", help="MLPerf ruleset (default: from the folder name, v4.0 -> 4.0.0)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "mlrepro-score-agreement",
                    help="where the summarizer's tables are kept between runs")
    ap.add_argument("--modes", default="folder,tree", help="comma-separated: folder, tree (engine: the engine alone)")
    ap.add_argument("--tolerance", type=float, default=0.0, help="minutes (default 0: exact)")
    ap.add_argument("--json", type=Path, help="write every folder's three numbers to this file")
    ap.add_argument("--show", type=int, default=40, help="differing folders listed per mode")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    from mlperf_logging.result_summarizer import result_summarizer as rs

    everything, ok = {}, True
    for root in args.rounds:
        root = root.resolve()
        ruleset = args.ruleset or _ruleset_of(root)
        cache = args.cache / f"{root.name}-{ruleset}"
        ref, notes, t_official = official(root, ruleset, cache)
        folders = benchmark_folders(root)
        keys = sorted({_key(f) for f in folders} | set(ref))
        results, seconds = {}, {}
        if "tree" in modes:
            results["tree"], seconds["tree"] = tree_mode(root, ruleset)
        if "engine" in modes:
            results["engine"], seconds["engine"] = engine_mode(folders, ruleset, lambda f: rs._benchmark_alias(f.name))
        if "folder" in modes:
            results["folder"], seconds["folder"] = folder_mode(folders, ruleset,
                                                               lambda f: rs._benchmark_alias(f.name))
        same = {m: compare(keys, ref, results[m], args.tolerance) for m in results}
        print(f"\n{root} (MLPerf training {ruleset}): {len(submitters(root))} submitters, {len(folders)} benchmark "
              f"folders with result files, {len(ref)} rows in the summarizer's table")
        for org, note in notes.items():
            print(f"  {org}: {note}")
        per_bench: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for m, cmp in same.items():
            for k, (eq, *_rest) in cmp.items():
                per_bench[k[2]][m][0] += int(eq)
                per_bench[k[2]][m][1] += 1
        head = f"{'benchmark':<22}" + "".join(f"{m + ' mode':>14}" for m in same)
        print(head + "\n" + "-" * len(head))
        totals = {m: [0, 0] for m in same}
        for b in sorted(per_bench):
            cells = []
            for m in same:
                s, n = per_bench[b][m]
                totals[m][0] += s
                totals[m][1] += n
                cells.append(f"{s}/{n}")
            print(f"{b:<22}" + "".join(f"{c:>14}" for c in cells))
        print(f"{'all':<22}" + "".join(f"{f'{s}/{n}':>14}" for s, n in totals.values()))
        print("largest difference where both score: " + ", ".join(f"{m} mode {_largest(cmp):.3g} min"
                                                                    for m, cmp in same.items()))
        timing = [f"summarizer {t_official:.1f} s (per submitter, as cached)"]
        timing += [f"{m} mode {seconds[m]:.1f} s" for m in seconds]
        print("seconds: " + ", ".join(timing))
        for m, cmp in same.items():
            bad = [(k, v) for k, v in cmp.items() if not v[0]]
            for k, (_, mine, theirs, note) in bad[:args.show]:
                fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
                print(f"  {m} DIFFERS {'/'.join(k)}: ours {fmt(mine)} official {fmt(theirs)}  {note[:160]}")
            if len(bad) > args.show:
                print(f"  ... and {len(bad) - args.show} more in {m} mode")
            ok = ok and not bad
        everything[str(root)] = {"ruleset": ruleset, "notes": notes, "seconds": {"official": t_official, **seconds},
                                 "folders": [{"path": "/".join(k), "official": ref.get(k),
                                              **{m: results[m].get(k) for m in results}} for k in keys]}
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
