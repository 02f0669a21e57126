"""Score whole MLPerf submission trees the way ``mlperf_logging.result_summarizer`` does.

A tree is ``<submitter>/`` with ``systems/<system>.json`` and
``results/<system>/<benchmark>/result_*.txt``, or a folder of such submitters.
The result is one row per system and benchmark: the summarizer's columns (its
system columns, the benchmark's time to train, GBS, samples to converge, RCP
verdict and the scaling factor it applied) plus ours (the RCP factor the runs
give, runs found/used/dropped, validity and the reasons).

Each benchmark folder is scored by mlrepro.scoring.engine, the engine per-folder mode and a
reproduction's seeds use too: every decision is mlperf_logging's own code, each log read once
(mlrepro.scoring.official feeds it), energy included for power submissions. Nothing is written into
the tree (the summarizer rewrites scaling.json and privateid.json there).
"""

from __future__ import annotations

import json
import math
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from mlrepro.scoring import rules as rules_mod
from mlrepro.scoring import engine
from mlrepro.scoring.checkers import mlperf_logging_version
from mlrepro.scoring.official import official_tools
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


# ---------------------------------------------------------------- one benchmark folder


def score_benchmark_folder(folder: str | os.PathLike, *, usage: str = rules_mod.USAGE, ruleset: str,
                           division: str = "closed", benchmark: str | None = None) -> dict:
    """The summarizer's numbers for one ``results/<system>/<benchmark>`` folder, with our checks
    (scoring.engine: `mlrepro score DIR --benchmark B` scores a folder with the same engine)."""
    # The summarizer brings pandas and scipy: loaded when a tree is scored, not by every scorer's import.
    from mlperf_logging.result_summarizer import result_summarizer as rs

    folder = Path(folder)
    benchmark = benchmark or rs._benchmark_alias(folder.name)
    row = engine.score_logs(engine.result_files(folder), benchmark=benchmark, ruleset=ruleset, usage=usage,
                            division=division, folder=folder, scaling="published")
    row["runs"] = [{"file": Path(r["file"]).name, "minutes": r["minutes"], "counted": r["counted"],
                    "reasons": r["reasons"]} for r in row["runs"]]
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
    # pandas and scipy, as above.
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
    # pandas and scipy, as above.
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
    # pandas: loaded when a tree is scored (mlrepro.scoring.cli imports this module for every `mlrepro score`).
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
