"""Score whole MLPerf submission trees the way ``mlperf_logging.result_summarizer`` does.

A tree is ``<submitter>/`` with ``systems/<system>.json`` and
``results/<system>/<benchmark>/result_*.txt``, or a folder of such submitters.
The result is one row per system and benchmark: the summarizer's columns (its
system columns, the benchmark's time to train, GBS, samples to converge, RCP
verdict and the scaling factor it applied) plus ours (the RCP factor the runs
give, runs found/used/dropped, validity and the reasons).

Every decision is mlperf_logging's own code, called on each log read once (mlrepro.scoring.official
feeds it): the official parser and compliance checker of the ruleset, the summarizer's
``_query_run_start_stop``, ``_compute_olympic_average`` and ``_get_scaling_factor``, and the
rcp_checker's ``check_directory`` and ``get_submission_epochs``. Nothing is written into the tree
(the summarizer rewrites scaling.json and privateid.json there).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from mlrepro.scoring import rules as rules_mod
from mlrepro.scoring.official import compliance, mllog_lines, official_tools, parse_lines
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

# Columns of the summarizer's detailed table (result_summarizer._get_column_schema and
# _get_strong_scaling_metric_schema), the benchmark columns turned into rows.
SYSTEM_COLUMNS = ["division", "availability", "submitter", "system", "number_of_nodes", "host_processor_model_name",
                  "host_processors_count", "accelerator_model_name", "accelerators_count", "framework", "notes",
                  "private_id"]
BENCHMARK_COLUMNS = ["benchmark", "time_to_train", "Energy", "GBS", "samples_to_converge", "RCP",
                     "rcp_scaling_factor"]
URL_COLUMNS = ["details_url", "code_url"]
OUR_COLUMNS = ["rcp_factor", "rcp_message", "olympic_minutes", "runs_found", "runs_used", "runs_dropped",
               "required_runs", "max_dropped_runs", "valid", "reasons", "run_notes", "folder"]
COLUMNS = SYSTEM_COLUMNS + BENCHMARK_COLUMNS + URL_COLUMNS + OUR_COLUMNS
# Keys of the lines rcp_checker.read_submission_file acts on; every other line
# leaves its state unchanged, so it is given only these.
_RCP_KEYS = ("global_batch_size", "submission_benchmark", "eval_error", "eval_accuracy", "train_samples", "run_stop")


# ---------------------------------------------------------------- one benchmark folder


def _run_of(path: Path, usage: str, ruleset: str) -> dict:
    """One result file: its minutes when the summarizer counts it, else why not."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    run: dict[str, Any] = {"file": path.name, "minutes": None, "counted": False, "reasons": [], "lines": []}
    try:
        lines = mllog_lines(path)
    except OSError as exc:
        run["reasons"].append(f"cannot read: {exc.strerror or exc}")
        return run
    run["lines"] = lines
    try:
        loglines, failed = parse_lines(lines, ruleset)
        # result_summarizer._read_result_file: compliance first, then parse errors.
        valid, messages = compliance(loglines, failed, usage, ruleset)
        if not valid:
            run["reasons"] += ["compliance check failed"] + messages[:5]
            return run
        if failed:
            run["reasons"].append(f"{len(failed)} MLLOG lines do not parse")
            return run
        start, stop = rs._query_run_start_stop(loglines)
    except ValueError as exc:  # what _compute_strong_score_standalone drops a run for
        run["reasons"].append(str(exc))
        return run
    except Exception as exc:  # the summarizer would stop here; we drop the run and say why
        run["reasons"].append(f"the official tools fail on this log: {type(exc).__name__}: {exc}")
        return run
    run["minutes"] = (stop - start) / 60 / 1000
    run["counted"] = True
    return run


def _rcp(folder: Path, runs: list[dict], usage: str, ruleset: str) -> dict:
    """rcp_checker.check_directory (as the summarizer calls it) and get_submission_epochs,
    run on copies of the result files that hold only the lines they read."""
    import numpy as np
    from mlperf_logging.rcp_checker import rcp_checker

    out: dict[str, Any] = {"RCP": None, "rcp_pass": None, "rcp_message": None, "rcp_factor": None, "GBS": None,
                           "samples_to_converge": None}
    tmp = Path(tempfile.mkdtemp(prefix="mlrepro-rcp-", dir=_scratch_root()))
    try:
        files = []
        for run in runs:
            f = tmp / run["file"]
            f.write_text("".join(ln + "\n" for ln in run["lines"] if any(k in ln for k in _RCP_KEYS)),
                         encoding="latin-1")
            files.append(str(f))
        try:
            # result_summarizer._compute_strong_scaling_scores, closed division.
            rcp_pass, rcp_msg, _ = rcp_checker.check_directory(
                str(tmp), usage, ruleset, False, False, rcp_file=None, rcp_pass="pruned_rcps", rcp_bypass=False,
                set_scaling=True)
            out["rcp_pass"], out["rcp_message"] = bool(rcp_pass), rcp_msg
            if not rcp_pass:
                out["RCP"] = ("Fail" if rcp_msg == "RCP found" else "Interp. Fail" if rcp_msg == "RCP Interpolation"
                              else "Missing" if "Missing" in rcp_msg else "No RCP" if rcp_msg == "Cannot find any RCPs"
                              else "Unknown state")
            else:
                out["RCP"] = "Pass"
            # check_directory leaves scaling.json where the summarizer would find it next time.
            scaling = tmp / "scaling.json"
            out["rcp_factor"] = float(json.loads(scaling.read_text())["scaling_factor"]) if scaling.is_file() else 1.0
            gbs, epochs, _ = rcp_checker.get_submission_epochs(files, ruleset, bert_train_samples=False)
            # The summarizer has the GBS even when the epochs are None (too many runs failed)
            # and the sort below raises.
            out["GBS"] = float(gbs) if gbs is not None else None
            epochs.sort()
            rejected = 1  # the summarizer's samples_rejected, whatever the benchmark
            if len(epochs) >= 2 * rejected + 1:
                out["samples_to_converge"] = float(np.mean(epochs[rejected:len(epochs) - rejected]))
        except Exception as exc:  # the summarizer prints "RCP/GBS computation failed" and goes on
            out["rcp_message"] = out["rcp_message"] or f"RCP/GBS computation failed: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _scratch_root() -> str | None:
    """Memory-backed when the machine has one: thousands of small files are written and removed."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def score_benchmark_folder(folder: str | os.PathLike, *, usage: str = rules_mod.USAGE, ruleset: str,
                           division: str = "closed", benchmark: str | None = None) -> dict:
    """The summarizer's numbers for one ``results/<system>/<benchmark>`` folder, with our checks."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    folder = Path(folder)
    benchmark = benchmark or rs._benchmark_alias(folder.name)
    reasons: list[str] = []
    try:
        brules = rules_mod.benchmark_rules(benchmark, ruleset, usage)
    except rules_mod.UnknownRules as exc:
        brules = None
        reasons.append(str(exc))
    # result_summarizer._compute_strong_score_standalone: glob "result_*.txt".
    files = sorted(folder.glob("result_*.txt"), key=lambda p: (len(p.name), p.name))
    runs = [_run_of(p, usage, ruleset) for p in files]
    scores = [r["minutes"] for r in runs if r["counted"]]
    dropped = len(runs) - len(scores)
    max_dropped = brules.max_dropped_runs if brules else (4 if benchmark == "unet3d" else 1)
    scaling_factor = float(rs._get_scaling_factor(str(folder)))
    olympic = None
    if dropped <= max_dropped:
        olympic = rs._compute_olympic_average(list(scores), dropped, max_dropped)
    score = olympic * scaling_factor if olympic is not None else None

    row: dict[str, Any] = {"benchmark": benchmark, "time_to_train": score, "Energy": None, "GBS": None,
                           "samples_to_converge": None, "RCP": None, "rcp_scaling_factor": scaling_factor,
                           "rcp_factor": None, "rcp_message": None, "olympic_minutes": olympic,
                           "runs_found": len(runs), "runs_used": len(scores), "runs_dropped": dropped,
                           "required_runs": brules.required_runs if brules else None,
                           "max_dropped_runs": max_dropped, "folder": str(folder)}
    if division == "closed" and runs:
        row.update(_rcp(folder, runs, usage, ruleset))
    rcp_pass = row.pop("rcp_pass", None)

    if not runs:
        reasons.append("no result_*.txt files")
    if brules and runs and len(runs) != brules.required_runs:
        reasons.append(f"{len(runs)} result files, {benchmark} needs {brules.required_runs}")
    if dropped > max_dropped:
        reasons.append(f"{dropped} runs dropped (at most {max_dropped} may be): no score")
    elif olympic is None and runs:
        reasons.append("not enough runs left for an olympic mean")
    if division == "closed" and runs:
        if rcp_pass is False:
            reasons.append(f"RCP check failed: {row['rcp_message']}")
        elif rcp_pass is None:
            reasons.append(row["rcp_message"] or "RCP check not run")
        if row["rcp_factor"] is not None and not math.isclose(row["rcp_factor"], scaling_factor, rel_tol=1e-9):
            reasons.append(f"scaling.json holds {scaling_factor:.6g} but the runs' RCP check gives "
                           f"{row['rcp_factor']:.6g} (the summarizer applies scaling.json, then rewrites it)")
    # A dropped run within the allowance is part of olympic scoring, not a defect.
    notes = [f"{r['file']} dropped: {'; '.join(r['reasons'][:2])}" for r in runs if not r["counted"]]
    row["valid"] = score is not None and not reasons
    row["reasons"] = reasons
    row["run_notes"] = notes
    row["runs"] = [{k: v for k, v in r.items() if k != "lines"} for r in runs]
    return row


# ---------------------------------------------------------------- trees


def is_submitter_folder(path: Path) -> bool:
    """result_summarizer._is_organization_folder."""
    return path.is_dir() and (path / "systems").exists() and (path / "results").exists()


def submitter_folders(paths: list[str | os.PathLike]) -> tuple[list[Path], list[dict]]:
    """The submitter folders named by `paths` (a submitter, or a folder of them), and
    an error row for each path that is neither."""
    found: list[Path] = []
    errors: list[dict] = []
    for p in map(Path, paths):
        if is_submitter_folder(p):
            found.append(p)
        elif p.is_dir():
            subs = [d for d in sorted(p.iterdir()) if not d.name.startswith(".") and d.is_dir()]
            orgs = [d for d in subs if is_submitter_folder(d)]
            if not orgs:
                errors.append(_error_row(p, "neither a submitter folder (systems/ and results/) nor a folder of them "
                                                "(to score the logs of one benchmark, give --benchmark)"))
            for d in subs:
                if d in orgs:
                    found.append(d)
                elif (d / "results").is_dir() or (d / "systems").is_dir():
                    errors.append(_error_row(d, "submitter folder needs both systems/ and results/"))
        else:
            errors.append(_error_row(p, "does not exist"))
    return found, errors


def _error_row(folder: Path, reason: str, **extra) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(extra, folder=str(folder), valid=False, reasons=[reason], run_notes=[], runs=[])
    return row


def _system_specs(submitter: Path, system: str, usage: str, ruleset: str) -> dict:
    """The summarizer's system columns (result_summarizer.summarize_results), or FieldError/OSError/ValueError."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    path = submitter / "systems" / f"{system}.json"
    if path.is_file():
        try:
            json.loads(path.read_text())
        except ValueError as exc:  # the summarizer stops with a TypeError on these
            raise ValueError(f"not valid JSON: {exc}") from None
    desc = rs._load_system_desc(str(submitter), system)
    ident = rs._get_id_file(str(submitter), system)
    desc["private_id"] = ident.get("private_id", "")
    get = rs._assert_in_desc_and_return
    specs = {
        "division": get(desc, "division"),
        "private_id": get(desc, "private_id"),
        "availability": get(desc, "status"),
        "submitter": get(desc, "submitter"),
        "system": get(desc, "system_name", query=rs._pretty_system_name),
        "host_processor_model_name": get(desc, "host_processor_model_name"),
        "number_of_nodes": get(desc, "number_of_nodes"),
        "host_processors_count": get(desc, ["host_processor_core_count", "host_processors_per_node",
                                            "number_of_nodes"],
                                     query=lambda d: int(d["host_processors_per_node"]) * int(d["number_of_nodes"])),
        "accelerator_model_name": get(desc, "accelerator_model_name", query=rs._pretty_accelerator_model_name),
        "accelerators_count": get(desc, ["accelerators_per_node", "number_of_nodes"],
                                  query=lambda d: int(d["accelerators_per_node"]) * int(d["number_of_nodes"])),
        "framework": get(desc, "framework", query=rs._pretty_framework),
        "notes": get(desc, ["hw_notes", "sw_notes"],
                     query=lambda d: ";".join(s for s in (d["hw_notes"], d["sw_notes"]) if s)),
        "details_url": rs._details_url(system, desc, usage, ruleset),
        "code_url": rs._code_url(desc, usage, ruleset),
    }
    return specs


def _tasks(submitter: Path, usage: str, ruleset: str) -> tuple[list[tuple], list[dict]]:
    """(benchmark folder, system columns) for every benchmark folder of a submitter, and error rows."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    tasks, errors = [], []
    results = submitter / "results"
    for system_folder in (d for d in sorted(results.iterdir()) if d.is_dir()):
        bench_folders = [d for d in sorted(system_folder.iterdir()) if d.is_dir()]
        try:
            specs = _system_specs(submitter, system_folder.name, usage, ruleset)
        except (rs.FieldError, OSError, ValueError) as exc:  # what summarize_results skips a system for
            msg = str(exc).replace("ERROR: ", "")
            where = f"systems/{system_folder.name}.json"
            for b in bench_folders or [system_folder]:
                errors.append(_error_row(b, f"system not scored: {msg} ({where})", submitter=submitter.name,
                                         benchmark=b.name if b is not system_folder else None))
            continue
        for b in bench_folders:
            tasks.append((str(b), specs))
    return tasks, errors


def _score_task(task: tuple, usage: str, ruleset: str) -> dict:
    folder, specs = task
    try:
        with official_tools():
            row = score_benchmark_folder(folder, usage=usage, ruleset=ruleset, division=specs["division"])
    except Exception as exc:  # one folder's surprise must not stop the others
        return _error_row(Path(folder), f"cannot score: {type(exc).__name__}: {exc}",
                          trace=traceback.format_exc(limit=3), **specs)
    return {**specs, **row}


def score_tree(paths: list[str | os.PathLike], *, ruleset: str, usage: str = rules_mod.USAGE, jobs: int = 1):
    """Score submission trees. Returns (DataFrame with COLUMNS, list of row dicts with per-run details)."""
    import pandas as pd

    rules_mod.benchmarks(ruleset, usage)  # UnknownRules for a ruleset mlperf_logging lacks
    orgs, rows = submitter_folders(paths)
    tasks: list[tuple] = []
    for org in orgs:
        t, errs = _tasks(org, usage, ruleset)
        tasks += t
        rows += errs
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            scored = list(pool.map(_score_task, tasks, [usage] * len(tasks), [ruleset] * len(tasks),
                                   chunksize=max(1, len(tasks) // (jobs * 4))))
    else:
        scored = [_score_task(t, usage, ruleset) for t in tasks]
    rows = scored + rows
    table = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], columns=COLUMNS)
    for col in ("reasons", "run_notes"):
        table[col] = table[col].map(lambda items: "; ".join(items) if isinstance(items, list) else items)
    order = ["submitter", "system", "benchmark", "folder"]
    keys = table[order].fillna("").astype(str)
    table = table.loc[keys.sort_values(order).index].reset_index(drop=True)
    return table, rows


def write_outputs(table, rows: list[dict], *, csv: str | None = None, json_path: str | None = None,
                  ruleset: str, usage: str, seconds: float | None = None) -> None:
    if csv:
        atomic_write_text(csv, table.to_csv(index=False))
    if json_path:
        from mlrepro.scoring.checkers import mlperf_logging_version

        atomic_write_json(json_path, {
            "usage": usage, "ruleset": ruleset, "tools": {"mlperf_logging": mlperf_logging_version()},
            "seconds": seconds, "columns": COLUMNS,
            "rows": [_jsonable({**{c: r.get(c) for c in COLUMNS}, "runs": r.get("runs", [])}) for r in rows],
        })


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return obj


def format_table(table) -> str:
    cols = ["submitter", "system", "benchmark", "time_to_train", "rcp_scaling_factor", "RCP", "runs_used",
            "runs_found", "valid"]
    view = table[cols].copy()
    view["time_to_train"] = view["time_to_train"].map(lambda x: "-" if x is None or x != x else f"{x:.3f}")
    lines = [view.to_string(index=False)]
    bad = table[~table["valid"].astype(bool)]
    if len(bad):
        lines += ["", "why not valid:"]
        for _, r in bad.iterrows():
            lines.append(f"  {r['submitter']}/{r['system']}/{r['benchmark']}: {r['reasons']}")
    return "\n".join(lines)
