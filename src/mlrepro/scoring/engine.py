"""The one scoring engine: a folder of MLPerf result logs scored as MLCommons' result_summarizer does.

Tree mode (every folder of a submission tree), per-folder mode (`mlrepro score DIR --benchmark B`)
and a reproduction's seeds all come here for an MLPerf benchmark, so a folder scores the same
whichever way it is given. Every decision is mlperf_logging's (fed through scoring.official): the
compliance checker, result_summarizer's ``_query_run_start_stop``, ``_compute_olympic_average``,
``_get_scaling_factor``, ``_compute_total_power`` and ``_index_olympic_average``, and rcp_checker's
``check_directory`` and ``get_submission_epochs``. Ours: which scaling factor applies (a published
folder's scaling.json, or the factor a reproduction's own runs give now; both are shown), and a step
the summarizer crashes on (its power step dividing by zero) is reported instead of stopping everything.

Nothing here changes the working directory or writes beside the logs, so a relative path gives the
same score from any directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mlrepro.scoring import official
from mlrepro.scoring import rules as rules_mod




def read_run(path: str | os.PathLike, *, usage: str, ruleset: str) -> dict:
    """One log, as result_summarizer._compute_strong_score_standalone reads it: its minutes when
    the summarizer counts it, else why not. Keeps the lines and parsed records for the caller."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    path = Path(path)
    run: dict[str, Any] = {"file": str(path), "minutes": None, "time_ms": None, "counted": False, "reasons": [],
                           "compliance": {"checked": False, "pass": None, "reasons": []},
                           "lines": [], "loglines": [], "problems": []}
    try:
        lines, repeats = official.read_mllog(path)
    except OSError as exc:
        run["reasons"].append(f"cannot read: {exc.strerror or exc}")
        return run
    if repeats:
        run["problems"].append(f"{repeats} MLLOG records printed by more than one rank read once")
    run["lines"] = lines
    try:
        loglines, failed = official.parse_lines(lines, ruleset)
        run["loglines"] = loglines
        # result_summarizer._read_result_file: compliance first, then parse errors.
        valid, messages = official.compliance(loglines, failed, usage, ruleset)
        run["compliance"] = {"checked": True, "pass": valid, "reasons": [] if valid else messages[:5]}
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
    run["time_ms"] = stop - start
    run["minutes"] = (stop - start) / 60 / 1000
    run["counted"] = True
    return run


def rcp(runs: list[dict], usage: str, ruleset: str) -> dict:
    """rcp_checker.check_directory (as the summarizer calls it) and get_submission_epochs, run on
    scratch copies of the runs that hold only the lines they read (named result_<i>.txt, the
    names check_directory looks for, whatever the logs are called)."""
    import numpy as np
    from mlperf_logging.rcp_checker import rcp_checker

    out: dict[str, Any] = {"RCP": None, "rcp_pass": None, "rcp_message": None, "rcp_factor": None, "GBS": None,
                           "samples_to_converge": None, "epochs": []}
    tmp = Path(tempfile.mkdtemp(prefix="mlrepro-rcp-", dir=_scratch_root()))
    try:
        files = []
        for i, run in enumerate(runs):
            f = tmp / f"result_{i}.txt"
            f.write_text("".join(ln + "\n" for ln in run["lines"] if any(k in ln for k in official.RCP_KEYS)),
                         encoding="latin-1")
            files.append(str(f))
        try:
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
            out["epochs"] = [rcp_checker.read_submission_file(f, ruleset, False)[1] for f in files]
            gbs, epochs, _ = rcp_checker.get_submission_epochs(files, ruleset, bert_train_samples=False)
            # The summarizer has the GBS even when the epochs are None (too many runs failed).
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


def published_scaling(folder: Path) -> tuple[float, str]:
    """The factor result_summarizer._get_scaling_factor applies to a folder, and where it came from."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    if not (folder / "scaling.json").is_file():
        return 1.0, "no scaling.json: 1.0"
    try:
        return float(rs._get_scaling_factor(str(folder))), "scaling.json"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder / 'scaling.json'} is unreadable: {type(exc).__name__}: {exc}") from None


def energy(folder: Path, runs: list[dict], ruleset: str, dropped: int, max_dropped: int,
           scaling_factor: float) -> dict:
    """The summarizer's energy of a power submission (a power/ folder beside the result files):
    result_summarizer._compute_total_power per counted run, olympic-averaged in run-time order.
    Where its power step fails (v4.0 smc-ac-power divides by zero) the energy is None and why."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    if not rs._has_power(str(folder)):
        return {"Energy": None, "energy_note": None}
    counted = [r for r in runs if r["counted"]]
    powers = []
    for r in counted:
        try:
            powers.append(_total_power(folder, Path(r["file"]), r["time_ms"], ruleset))
        except Exception as exc:  # AssertionError (no node_*.txt), ZeroDivisionError, ValueError
            name = Path(r["file"]).name
            return {"Energy": None, "energy_note": f"energy not computed: the summarizer's power step fails on "
                                                   f"{name}: {type(exc).__name__}: {exc or 'no power logs'}"}
    if dropped > max_dropped:
        return {"Energy": None, "energy_note": "energy not computed: too many runs dropped"}
    minutes = [r["minutes"] for r in counted]
    index = [i for i, _ in sorted(enumerate(minutes), key=lambda x: x[1])]
    mean = rs._index_olympic_average(powers, index, dropped, max_dropped)
    return {"Energy": mean * scaling_factor if mean is not None else None, "energy_note": None}


def _total_power(folder: Path, result_file: Path, time_ms: float, ruleset: str) -> float:
    """result_summarizer._compute_total_power, each power log read by official.mllog_lines and
    parse_lines: the same records, without parse_file's regular expression, which is quadratic in
    the line length and made energy the slowest part of a round (v4.0's smc power logs)."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    run = folder / "power" / result_file.name.split(".")[0]
    nodes, sws = sorted(run.glob("node_*.txt")), sorted(run.glob("sw_*.txt"))
    assert len(nodes) > 0  # as the summarizer asserts
    total = 0.0
    for f in nodes:
        total += rs._compute_power_node(official.parse_lines(official.mllog_lines(f), ruleset)[0], time_ms)
    for f in sws:
        total += rs._compute_power_sw(official.parse_lines(official.mllog_lines(f), ruleset)[0], time_ms)
    return total


def score_logs(files: list[Path], *, benchmark: str, ruleset: str, usage: str = rules_mod.USAGE,
               division: str = "closed", folder: Path | None = None, scaling: str = "published") -> dict:
    """Score the result logs of one benchmark folder as result_summarizer does.

    `scaling` "published": the factor the summarizer applies (the folder's scaling.json, else 1.0);
    "recomputed": the factor the runs' RCP check gives now (a reproduction's own seeds). Both are
    in the result: rcp_scaling_factor (applied) and rcp_factor (recomputed).
    Call inside ``official_tools()``.
    """
    from mlperf_logging.result_summarizer import result_summarizer as rs

    reasons: list[str] = []
    try:
        brules = rules_mod.benchmark_rules(benchmark, ruleset, usage)
    except rules_mod.UnknownRules as exc:
        brules = None
        reasons.append(str(exc))
    runs = [read_run(p, usage=usage, ruleset=ruleset) for p in files]
    scores = [r["minutes"] for r in runs if r["counted"]]
    dropped = len(runs) - len(scores)
    max_dropped = brules.max_dropped_runs if brules else (4 if benchmark == "unet3d" else 1)
    row: dict[str, Any] = {"benchmark": benchmark, "time_to_train": None, "Energy": None, "energy_note": None,
                           "GBS": None, "samples_to_converge": None, "RCP": None, "rcp_scaling_factor": None,
                           "scaling_source": None, "rcp_factor": None, "rcp_message": None, "rcp_pass": None,
                           "olympic_minutes": None, "runs_found": len(runs), "runs_used": len(scores),
                           "runs_dropped": dropped, "required_runs": brules.required_runs if brules else None,
                           "max_dropped_runs": max_dropped, "folder": str(folder) if folder else None, "epochs": []}
    if division == "closed" and runs:
        row.update(rcp(runs, usage, ruleset))
    if scaling == "published" and folder is not None:
        try:
            row["rcp_scaling_factor"], row["scaling_source"] = published_scaling(folder)
        except ValueError as exc:
            reasons.append(str(exc))
            row["rcp_scaling_factor"], row["scaling_source"] = 1.0, "scaling.json unreadable: 1.0"
    else:
        row["rcp_scaling_factor"] = row["rcp_factor"] if row["rcp_pass"] else 1.0
        row["scaling_source"] = "recomputed from the runs' RCP check"
    olympic = None
    if dropped <= max_dropped:
        olympic = rs._compute_olympic_average(list(scores), dropped, max_dropped)
    row["olympic_minutes"] = olympic
    row["time_to_train"] = olympic * row["rcp_scaling_factor"] if olympic is not None else None
    if folder is not None:
        row.update(energy(folder, runs, ruleset, dropped, max_dropped, row["rcp_scaling_factor"]))

    if not runs:
        reasons.append("no result logs")
    if brules and runs and len(runs) != brules.required_runs:
        reasons.append(f"{len(runs)} result files, {benchmark} needs {brules.required_runs}")
    if dropped > max_dropped:
        reasons.append(f"{dropped} runs dropped (at most {max_dropped} may be): no score")
    elif olympic is None and runs:
        reasons.append("not enough runs left for an olympic mean")
    if division == "closed" and runs:
        if row["rcp_pass"] is False:
            reasons.append(f"RCP check failed: {row['rcp_message']}")
        elif row["rcp_pass"] is None:
            reasons.append(row["rcp_message"] or "RCP check not run")
        if (row["rcp_factor"] is not None and scaling == "published"
                and abs(row["rcp_factor"] - row["rcp_scaling_factor"]) > 1e-9 * max(1.0, row["rcp_factor"])):
            reasons.append(f"{row['scaling_source']} gives {row['rcp_scaling_factor']:.6g} but the runs' RCP check "
                           f"gives {row['rcp_factor']:.6g} (the summarizer applies the published one)")
    if row["energy_note"]:
        reasons.append(row["energy_note"])
    row["reasons"] = reasons
    row["run_notes"] = [f"{Path(r['file']).name} dropped: {'; '.join(r['reasons'][:2])}"
                        for r in runs if not r["counted"]]
    row["valid"] = row["time_to_train"] is not None and not reasons
    row["runs"] = runs
    return row


def submission_epochs(lines: list[str], ruleset: str) -> tuple[bool, Any]:
    """rcp_checker.read_submission_file on one run's lines: (converged, what the RCP check counts:
    samples for the LLM benchmarks, epochs for most, stable_diffusion's first passing evaluation)."""
    from mlperf_logging.rcp_checker import rcp_checker

    fd, name = tempfile.mkstemp(prefix="mlrepro-run-", suffix=".txt", dir=_scratch_root())
    try:
        with os.fdopen(fd, "w", encoding="latin-1") as fh:
            fh.write("".join(ln + "\n" for ln in lines if any(k in ln for k in official.RCP_KEYS)))
        with official.official_tools():  # it logs a warning for runs that did not converge
            not_converged, epochs, _, _ = rcp_checker.read_submission_file(name, ruleset, False)
    except Exception:  # a log it cannot read (a value of the wrong type): no count
        return False, None
    finally:
        os.unlink(name)
    return (False, None) if not_converged else (True, epochs)


def logs_folder(files: list[Path]) -> Path | None:
    """The one folder all `files` are in, if they are in one."""
    parents = {Path(f).absolute().parent for f in files}
    return parents.pop() if len(parents) == 1 else None


def is_published(folder: Path | None) -> bool:
    """A folder scored with the factor the summarizer applies: it holds a scaling.json, or it is a
    benchmark folder of a submission (<submitter>/results/<system>/<benchmark>, systems/ beside
    results/), where no scaling.json means the review applied none."""
    if folder is None:
        return False
    if (folder / "scaling.json").is_file():
        return True
    return folder.parent.parent.name == "results" and (folder.parent.parent.parent / "systems").is_dir()


def runs_rcp(runs: list[dict], usage: str, ruleset: str, dropped: int, max_dropped: int,
             reasons: list[str]) -> tuple[dict, dict] | None:
    """The RCP check, the scaling factor and the energy of scored runs (each with its "file", and
    "counted", "minutes", "time_ms" as read_run gave them), as the summarizer makes them; why the
    result is not valid is added to `reasons`. None when the logs are not all there any more.

    A published folder (is_published) gets the factor the summarizer applies; other runs (a
    reproduction's seeds) the factor their RCP check gives now. Both are in the answer."""
    files = [Path(str(r.get("file"))) for r in runs]
    if not runs or not all(r.get("file") and f.is_file() for r, f in zip(runs, files)):
        return None
    folder = logs_folder(files)
    read = [{"file": str(f), "lines": official.mllog_lines(f), "counted": bool(r.get("counted")),
             "minutes": r.get("minutes"), "time_ms": r.get("time_ms")} for f, r in zip(files, runs)]
    with official.official_tools():
        row = rcp(read, usage, ruleset)
    applied, source = (row["rcp_factor"] if row["rcp_pass"] else 1.0), "recomputed from the runs' RCP check"
    if is_published(folder):
        try:
            applied, source = published_scaling(folder)
        except ValueError as exc:
            reasons.append(str(exc))
    out = {"checked": row["rcp_pass"] is not None, "pass": row["rcp_pass"], "scaling_factor": applied,
           "recomputed_factor": row["rcp_factor"], "scaling_source": source, "reason": row["rcp_message"] or "",
           "rcp": row["RCP"], "global_batch_size": row["GBS"], "submission_mean": row["samples_to_converge"]}
    if row["rcp_pass"] is False:
        reasons.append(f"RCP check failed: {out['reason']}")
    elif row["rcp_pass"] is None:
        reasons.append(f"RCP check not possible: {out['reason']}")
    if row["rcp_factor"] is not None and abs(row["rcp_factor"] - applied) > 1e-9 * max(1.0, applied):
        reasons.append(f"{source} gives {applied:.6g} but the runs' RCP check gives {row['rcp_factor']:.6g} "
                       f"(the summarizer applies the published one)")
    found = energy(folder, read, ruleset, dropped, max_dropped, applied) if folder else {"Energy": None}
    if found.get("energy_note"):
        reasons.append(found["energy_note"])
    return out, {"value": found["Energy"], "note": found.get("energy_note")}


def result_files(folder: Path) -> list[Path]:
    """result_summarizer's glob ``<folder>/result_*.txt``, in a stable order."""
    return sorted(folder.glob("result_*.txt"), key=lambda p: (len(p.name), p.name))


def public(run: dict) -> dict:
    """A run without the lines and parsed records (for JSON)."""
    return {k: v for k, v in run.items() if k not in ("lines", "loglines")}
