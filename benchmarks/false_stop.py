"""How often the early stop stops a reproduction that would not have ended "not reproduced" (issue 24).

Each pool of reference runs (the miniatures' shipped runs, and published MLPerf v5.0 runs of one
system: 10 per system for llama2_70b_lora) is resampled "as if it were yours": a reproduction draws
its N seeds with replacement from the pool, the early-stop policy looks after each seed from
min_seeds on (mlrepro.scoring.running_verdict.should_stop, exactly what the workflow runs), and the
completed reproduction is judged against the pool by the final verdict's method. A false stop is a
stop of a reproduction that the final verdict does not call "not reproduced" (it calls it reproduced,
or inconclusive: a stop claims more than the seeds would have shown). The same draws with the time per
sample multiplied by a slow-down show how soon a slower machine is stopped.

    .venv/bin/python benchmarks/false_stop.py                      # miniatures + NVIDIA's five systems
    .venv/bin/python benchmarks/false_stop.py --all --reproductions 2000 --jobs 16
    .venv/bin/python benchmarks/false_stop.py --save-pools pools.json   # score the logs once, here
    .venv/bin/python benchmarks/false_stop.py --pools pools.json ...     # elsewhere, without the logs

Prints one row per pool: reproductions, how many the final verdict calls reproduced / inconclusive /
not reproduced, false stops among those it does not call not reproduced with the rate and its 95% upper
bound (Clopper-Pearson), and per slow-down the share stopped and the mean seed count at the stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mlrepro.scoring import running_verdict as rv  # noqa: E402

PUBLISHED = Path("/work/data/v5.0")


def score_pools(include_all: bool, published: Path = PUBLISHED) -> dict:
    """{pool name: {"required", "max_failed", "runs": [[counted, minutes, samples], ...]}}; `published`
    is a checkout of training_results_v5.0 (its <submitter>/results/<system>/<benchmark> folders)."""
    from mlrepro import config
    from mlrepro.scoring import rules as scoring_rules
    from mlrepro.scoring import score

    pools = {}
    for name in ("mini_lora", "mini_gpt"):
        bench = config.load_benchmark(ROOT, name)
        rules = scoring_rules.for_benchmark(bench)
        logs = sorted(bench.reference["runs"].glob("result_*.txt"))
        pools[f"{name} (shipped reference)"] = _pool(logs, rules, score)
    for bench_name in ("llama2_70b_lora", "llama31_405b"):
        rules = scoring_rules.rules_for(bench_name)
        pattern = f"*/results/*/{bench_name}" if include_all else f"NVIDIA/results/*/{bench_name}"
        for folder in sorted(Path(published).glob(pattern)):
            logs = sorted(folder.glob("result_*.txt"))
            if len(logs) >= 3:
                pools[f"{bench_name} {folder.parts[-4]}/{folder.parts[-2]}"] = _pool(logs, rules, score)
    return pools


def _pool(logs, rules, score) -> dict:
    runs = rv.runs_of([score.score_run(p, rules, run_compliance=False) for p in logs])
    return {"required": rules.required_runs, "max_failed": rules.max_failed_runs,
            "runs": [[r.counted, r.minutes, r.samples] for r in runs]}


def _simulate(task) -> tuple[str, float, dict]:
    name, pool, policy, reproductions, slowdown, seed = task
    runs = [rv.Run(*r) for r in pool["runs"]]
    return name, slowdown, rv.simulate_policy(runs, pool["required"], pool["max_failed"], policy, reproductions,
                                              slowdown=slowdown, rng_seed=seed)


def upper_bound(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a rate of k in n."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reproductions", type=int, default=400, help="reproductions per pool (default 400)")
    ap.add_argument("--slow-reproductions", type=int, help="reproductions per pool and slow-down (default: as many)")
    ap.add_argument("--only", help="pools whose name contains this text")
    ap.add_argument("--slowdowns", default="1.25,1.5,2", help="time-per-sample factors of the slower machine")
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--min-seeds", type=int, default=3)
    ap.add_argument("--all", action="store_true", help="every submitter's systems, not only NVIDIA's")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pools", help="read the scored pools from this JSON instead of the logs")
    ap.add_argument("--save-pools", help="score the logs, write the pools to this JSON and stop")
    ap.add_argument("--published", default=str(PUBLISHED), help="a checkout of training_results_v5.0")
    args = ap.parse_args()
    if args.pools:
        pools = json.loads(Path(args.pools).read_text())
    else:
        pools = score_pools(args.all, Path(args.published))
    if args.only:
        pools = {k: v for k, v in pools.items() if args.only in k or "mini" in k}
    if args.save_pools:
        Path(args.save_pools).write_text(json.dumps(pools, indent=1))
        print(f"{len(pools)} pools written to {args.save_pools}")
        return 0
    policy = rv.EarlyStop(confidence=args.confidence, min_seeds=args.min_seeds)
    slowdowns = [float(s) for s in args.slowdowns.split(",") if s]
    chunks = max(1, args.jobs)
    tasks = []
    for name, pool in pools.items():
        if pool["required"] <= policy.min_seeds:
            continue
        for factor in [1.0, *slowdowns]:
            wanted = args.reproductions if factor == 1.0 else (args.slow_reproductions or args.reproductions)
            per = -(-wanted // chunks)
            for c in range(chunks):
                tasks.append((name, pool, policy, per, factor, zlib.crc32(f"{name} {factor} {c}".encode())))
    totals: dict[tuple[str, float], dict] = {}
    with ProcessPoolExecutor(args.jobs) as ex:
        for name, factor, res in ex.map(_simulate, tasks):
            acc = totals.setdefault((name, factor), {})
            for key in ("reproductions", "final_reproduced", "final_inconclusive", "final_not_reproduced",
                        "false_stops", "stops", "seeds_at_stop"):
                acc[key] = acc.get(key, 0) + res[key]
    head = ("| pool | runs | N | reproductions | reproduced / inconclusive / not reproduced at the end | "
            "false stops | false-stop rate | 95% upper |"
            + "".join(f" stopped at {f:g}x (mean seeds) |" for f in slowdowns))
    print(f"early_stop: confidence {policy.confidence}, min_seeds {policy.min_seeds} "
          f"(budget 1 - confidence = {1 - policy.confidence:.3g}); {rv.SIMULATIONS} simulations per look\n")
    print(head)
    print("|" + " --- |" * (8 + len(slowdowns)))
    all_rep = all_false = 0
    never = [name for name, pool in pools.items() if pool["required"] <= policy.min_seeds]
    for name, pool in pools.items():
        if name in never:
            continue
        base = totals[(name, 1.0)]
        healthy = base["reproductions"] - base["final_not_reproduced"]
        all_rep += healthy
        all_false += base["false_stops"]
        rate = base["false_stops"] / healthy if healthy else float("nan")
        cells = []
        for f in slowdowns:
            s = totals[(name, f)]
            mean = s["seeds_at_stop"] / s["stops"] if s["stops"] else float("nan")
            cells.append(f" {s['stops'] / s['reproductions']:.0%} ({mean:.1f}) |")
        print(f"| {name} | {len(pool['runs'])} | {pool['required']} | {base['reproductions']} | "
              f"{base['final_reproduced']} / {base['final_inconclusive']} / {base['final_not_reproduced']} | "
              f"{base['false_stops']} | {rate:.4f} | {upper_bound(base['false_stops'], healthy):.4f} |"
              + "".join(cells))
    if never:
        print(f"\n{len(never)} pools need N <= min_seeds ({policy.min_seeds}) seeds and are never stopped early: "
              + ", ".join(never))
    if all_rep:
        print(f"\nall pools: {all_false} false stops in {all_rep} reproductions not judged not reproduced: rate "
              f"{all_false / all_rep:.4f}, 95% upper bound {upper_bound(all_false, all_rep):.4f} "
              f"(budget {1 - policy.confidence:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
