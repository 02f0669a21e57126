"""How often the final verdict says each thing, for reproductions of known speed (issue 37, item 7).

Each pool of reference runs (every published MLPerf Training v5.0 system of llama2_70b_lora and
llama31_405b, and the miniatures' shipped runs) is resampled "as if it were yours": a reproduction
draws N counted runs with replacement from the pool, their time per sample (so their time to train)
multiplied by a slowdown, and is judged against the pool by the verdict's own method
(mlrepro.scoring.running_verdict.simulate_verdicts, which calls mlrepro.scoring.verdict.assess). Beside
it, the rule this method replaced (two-sided Mann-Whitney U tests at alpha 0.05 on time to train, time
per sample and samples to converge, a difference counting only beyond the 5% tolerance between olympic
means), to show what it could not tell.

    .venv/bin/python benchmarks/verdict_power.py --published /work/data/v5.0
    .venv/bin/python benchmarks/false_stop.py --all --published DIR --save-pools pools.json   # score once
    .venv/bin/python benchmarks/verdict_power.py --pools pools.json [--per-pool]

Prints, per run count and slowdown, the share of reproductions given each verdict over the published
systems (every system's reproductions pooled, and the worst single system), then the same per benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mlrepro.scoring import running_verdict as rv  # noqa: E402
from mlrepro.scoring import verdict  # noqa: E402

REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED = verdict.VERDICTS


def mann_whitney_rule(yours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """The replaced rule, per set of `yours` (sets x runs x columns): True where it said "reproduced"."""
    from scipy.stats import mannwhitneyu

    different = np.zeros(yours.shape[0], bool)
    for col in range(yours.shape[-1]):
        p = np.nan_to_num(mannwhitneyu(yours[..., col], theirs[None, :, col], axis=-1).pvalue, nan=1.0)
        mine = np.sort(yours[..., col], axis=-1)
        mine = (mine[..., 1:-1] if mine.shape[-1] >= 3 else mine).mean(axis=-1)
        ref = verdict.olympic(theirs[:, col])
        different |= (p < verdict.ALPHA) & (np.abs(mine / ref - 1) * 100 > verdict.TOLERANCE_PCT)
    return ~different


def simulate(pool: dict, runs: int, slowdown: float, reproductions: int, seed: int, before: bool) -> dict:
    """{verdict: count} of the method, and "before_reproduced" of the replaced rule on the same draws."""
    pool_runs = [rv.Run(*r) for r in pool["runs"]]
    counts = rv.simulate_verdicts(pool_runs, runs, slowdown, reproductions, rng_seed=seed)
    if before:
        # the same draws again (same seed), judged by the replaced rule
        rng = np.random.default_rng(seed)
        counted = [r for r in pool_runs if r.counted]
        ref = rv._plain(counted, all(r.samples for r in counted))
        yours = ref[rng.integers(0, len(ref), size=(reproductions, runs))]
        yours[..., :2] *= slowdown
        counts["before_reproduced"] = int(mann_whitney_rule(yours, ref).sum())
    return counts


def detectable(pool: dict, runs: int) -> float:
    """verdict.power's smallest slowdown (in %) for `runs` of yours that vary per sample as the pool does."""
    counted = [r for r in pool["runs"] if r[0]]
    per_sample = np.log([m / s for _, m, s in counted]) if all(r[2] for r in counted) else np.log([r[1] for r in counted])
    return verdict.power(float(per_sample.std(ddof=1)), runs, len(counted))["detectable_slowdown_pct"]


def group_of(name: str) -> str:
    return name.split(" ")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", help="read the scored pools from this JSON (benchmarks/false_stop.py --save-pools)")
    ap.add_argument("--published", default="/work/data/v5.0", help="a checkout of training_results_v5.0")
    ap.add_argument("--reproductions", type=int, default=2000, help="reproductions per pool, run count and slowdown")
    ap.add_argument("--runs", default="3,10", help="run counts of the reproductions")
    ap.add_argument("--slowdowns", default="0,5,10,25,60", help="slower by these percentages")
    ap.add_argument("--no-before", action="store_true", help="leave out the replaced Mann-Whitney rule")
    ap.add_argument("--per-pool", action="store_true", help="also one row per pool")
    args = ap.parse_args()
    if args.pools:
        pools = json.loads(Path(args.pools).read_text())
    else:
        import false_stop

        pools = false_stop.score_pools(True, Path(args.published))
    run_counts = [int(n) for n in args.runs.split(",")]
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    results: dict[tuple[str, int, float], dict] = {}
    for name, pool in pools.items():
        for n in run_counts:
            for pct in slowdowns:
                seed = zlib.crc32(f"{name} {n} {pct}".encode())
                results[name, n, pct] = simulate(pool, n, 1 + pct / 100, args.reproductions, seed, not args.no_before)
    published = [name for name in pools if "shipped" not in name]
    before = not args.no_before

    def row(names: list[str], n: int, pct: float) -> str:
        total = {key: sum(results[name, n, pct][key] for name in names) for key in results[names[0], n, pct]}
        count = len(names) * args.reproductions
        worst_not = max(results[name, n, pct][NOT_REPRODUCED] for name in names) / args.reproductions
        worst_rep = max(results[name, n, pct][REPRODUCED] for name in names) / args.reproductions
        cells = [f"{total[v] / count:.1%}" for v in verdict.VERDICTS]
        cells += [f"{worst_rep:.1%}", f"{worst_not:.1%}"]
        if before:
            cells.append(f"{total['before_reproduced'] / count:.1%}")
        return f"| {n} | {pct:g}% | " + " | ".join(cells) + " |"

    head = ("| runs | slower by | reproduced | inconclusive | not reproduced | worst system: reproduced | "
            "worst system: not reproduced |" + (" Mann-Whitney rule: reproduced |" if before else ""))
    rule = "|" + " --- |" * (7 + before)
    print(f"verdict.assess: intervals of the ratio of geometric means that hold together at {verdict.CONFIDENCE:.0%} "
          f"({verdict.confidence_text(verdict.each_confidence(3))} each of three) against the "
          f"{verdict.TOLERANCE_PCT:g}% tolerance; {args.reproductions} reproductions "
          f"per pool, run count and slowdown, drawn with replacement from the pool's counted runs\n")
    groups = {"all published systems": published}
    for name in published:
        groups.setdefault(group_of(name), []).append(name)
    for name in pools:
        if name not in published:
            groups[name] = [name]
    for label, names in groups.items():
        print(f"### {label} ({len(names)} {'systems' if len(names) > 1 else 'pool'})\n")
        print(head)
        print(rule)
        for n in run_counts:
            for pct in slowdowns:
                print(row(names, n, pct))
        print()
    print("### What the runs can tell: the smallest slowdown called not reproduced 80% of the time "
          "(verdict.power, your runs as steady per sample as the reference's)\n")
    print("| pool | systems | runs | median over systems | largest |")
    print("| --- | --- | --- | --- | --- |")
    for label, names in groups.items():
        for n in run_counts:
            found = [detectable(pools[name], n) for name in names]
            print(f"| {label} | {len(names)} | {n} | {np.median(found):.1f}% | {max(found):.1f}% |")
    print()
    if args.per_pool:
        print("### per pool: reproduced / inconclusive / not reproduced\n")
        print("| pool | " + " | ".join(f"{n} runs, {pct:g}%" for n in run_counts for pct in slowdowns) + " |")
        print("|" + " --- |" * (1 + len(run_counts) * len(slowdowns)))
        for name in pools:
            cells = ["/".join(f"{results[name, n, pct][v] / args.reproductions:.0%}" for v in verdict.VERDICTS)
                     for n in run_counts for pct in slowdowns]
            print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
