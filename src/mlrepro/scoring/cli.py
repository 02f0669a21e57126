"""`mlrepro score`: the logs of one benchmark (--benchmark), or whole submission trees."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from mlrepro import config
from mlrepro.scoring import tree_score
from mlrepro.scoring.logs import collect_logs
from mlrepro.scoring.rules import ALIASES, DEFAULT_RULESET, USAGE, RulesError, UnknownRules, is_mlperf, rules_for
from mlrepro.scoring.score import run_record, score_records


def _config_target(benchmark: str) -> dict:
    """required_runs/target of config/benchmarks/<benchmark>.yaml (here, else in mlrepro's repository), if any."""
    for root in (Path.cwd(), config.PACKAGE_ROOT):
        try:
            found = config.benchmark_scoring(root, benchmark)
        except config.ConfigError as exc:
            raise RulesError(str(exc)) from None
        if found:
            return found
    return {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="log files or folders of them; without --benchmark: submission trees "
                             "(<submitter>/ with systems/ and results/, or a folder of submitters)")
    parser.add_argument("--benchmark",
                        help="score the logs as one benchmark: any MLPerf benchmark of the ruleset "
                             "(our names such as llama2_lora too), or mini_lora; without it PATH is a submission tree")
    parser.add_argument("--csv", metavar="FILE", help="submission trees: write the table as CSV to FILE")
    parser.add_argument("--html", metavar="FILE", help="submission trees: write the table as an HTML page to FILE")
    parser.add_argument("--jobs", type=int, default=1, help="submission trees: processes to score with")
    parser.add_argument("--ruleset", default=None, help=f"MLPerf ruleset (default {DEFAULT_RULESET})")
    parser.add_argument("--json", metavar="FILE", help="write the full result as JSON to FILE")
    parser.add_argument("--target", help="override the target, e.g. eval_loss<=3.5")
    parser.add_argument("--required-runs", type=int, help="override the number of runs required")
    parser.add_argument("--no-compliance", action="store_true", help="skip the official compliance checker")


def run(args: argparse.Namespace) -> int:
    if args.benchmark is None:
        return score_trees(args)
    try:
        name = ALIASES.get(args.benchmark, args.benchmark)
        target, required = args.target, args.required_runs
        if not is_mlperf(name, args.ruleset):
            cfg = _config_target(args.benchmark)
            target = target or cfg.get("target")
            required = required or cfg.get("required_runs") or 10
        rules = rules_for(args.benchmark, ruleset=args.ruleset, required_runs=required, target=target)
    except RulesError as exc:
        print(f"mlrepro score: {exc}", file=sys.stderr)
        return 2
    files, notes = collect_logs(args.paths)
    result = score_records([run_record(f, rules, run_compliance=not args.no_compliance) for f in files], rules)
    result = result.replace(reasons=notes + result.reasons)
    print(format_summary(result.to_json()))
    if args.json:
        try:
            result.write(args.json)
        except OSError as exc:
            print(f"mlrepro score: cannot write {args.json}: {exc}", file=sys.stderr)
            return 1
    return 0 if result.valid else 1


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_summary(score: dict) -> str:
    """A human-readable summary of a score dict."""
    rules_line = (f"MLPerf Training {score['ruleset']} ({score['mlperf_benchmark']})" if score.get("mlperf_benchmark")
                  else "no MLPerf ruleset: generic checks")
    t = score["target"]
    target = t.get("check") or f"{t['metric']} {t['direction']} {t['value']:g}"
    lines = [f"benchmark {score['benchmark']}: {rules_line}; target {target}; "
             f"{score['required_runs']} runs required", ""]
    header = f"{'seed':>8}  {'minutes':>10}  {'status':<9} {'samples':>9}  {'compliance':<10}  verdict"
    lines += [header, "-" * len(header)]
    for r in score["runs"]:
        comp = r.get("compliance") or {}
        comp_s = "-" if not comp.get("checked") else ("pass" if comp.get("pass") else "FAIL")
        verdict = ("NOT counted: " + "; ".join(r.get("reasons") or ["?"]) if not r.get("counted")
                   else "counted" + ("; but " + "; ".join(r["reasons"]) if r.get("reasons") else ""))
        samples = r.get("samples_to_converge")
        lines.append(f"{str(r.get('seed')):>8}  {_fmt(r.get('minutes')):>10}  {str(r.get('status')):<9} "
                     f"{_fmt(samples, 'g') if samples is not None else '-':>9}  {comp_s:<10}  {verdict}")
        for prob in (r.get("problems") or [])[:3]:
            lines.append(f"{'':>10}problem: {prob}")
    rcp = score["rcp"]
    rcp_s = ("not checked: " if not rcp["checked"] else ("PASS: " if rcp["pass"] else "FAIL: ")) + rcp["reason"]
    factor = f"scaling factor {rcp['scaling_factor']:.6f}"
    if rcp.get("scaling_source"):
        recomputed = rcp.get("recomputed_factor")
        factor += f"  ({rcp['scaling_source']}" + (f"; the runs' RCP check gives {recomputed:.6f})"
                                                   if recomputed is not None else ")")
    lines += ["", f"olympic mean   {_fmt(score['olympic_minutes'])} min", f"RCP            {rcp_s}", factor]
    energy = score.get("energy") or {}
    if energy.get("value") is not None or energy.get("note"):
        lines.append(f"energy         {_fmt(energy.get('value'), '.2f')}"
                     + (f"  ({energy['note']})" if energy.get("note") else ""))
    lines.append(f"score          {_fmt(score['score_minutes'])} min  ({'VALID' if score['valid'] else 'NOT VALID'})")
    lines += [f"  why not valid: {r}" for r in score["reasons"]]
    return "\n".join(lines)


def score_trees(args: argparse.Namespace) -> int:
    """``mlrepro score TREE...`` (no --benchmark): the whole-tree table."""
    ruleset = args.ruleset or DEFAULT_RULESET
    t0 = time.perf_counter()
    try:
        jobs = max(1, int(getattr(args, "jobs", 1) or 1))
        table, rows = tree_score.score_tree(args.paths, ruleset=ruleset, jobs=jobs)
    except UnknownRules as exc:
        print(f"mlrepro score: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    try:
        tree_score.write_outputs(table, rows, csv=args.csv, json_path=args.json, ruleset=ruleset, usage=USAGE,
                                 seconds=seconds)
        if getattr(args, "html", None):
            # pyplot: loaded only when a page is asked for.
            from mlrepro.scoring import report

            report.write_tree_report(table, args.html, title=f"MLPerf {USAGE} {ruleset} results")
    except OSError as exc:
        print(f"mlrepro score: cannot write: {exc}", file=sys.stderr)
        return 1
    print(tree_score.format_table(table))
    scored = int(table["time_to_train"].notna().sum())
    print(f"\n{len(table)} rows, {scored} with a score, {int(table['valid'].astype(bool).sum())} valid "
          f"({seconds:.1f} s, MLPerf {USAGE} {ruleset})")
    return 0 if len(table) and bool(table["valid"].astype(bool).all()) else 1
