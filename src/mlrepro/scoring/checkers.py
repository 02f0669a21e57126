"""mlperf_logging's checkers, run so that they cannot touch the user's folders.

The official tools write ``compliance_checker.log`` / ``rcp_checker.log`` /
``package_checker.log`` into the working directory, and the RCP and package
checkers rewrite ``scaling.json`` inside the folder they check. Every call here
therefore runs inside a fresh temporary folder (as the working directory, and
on a copy of any folder a tool would write into), and hands back a structured
verdict with the tool's reasons instead of its console output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Sequence
from mlrepro.util.proc import run

USAGE = "training"
_MAX_REASON_CHARS = 400


@dataclass
class Verdict:
    """What a checker concluded. `passed` is None when the check was not run."""

    checked: bool
    passed: bool | None
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"checked": self.checked, "pass": self.passed, "reasons": list(self.reasons)}


@contextlib.contextmanager
def scratch_dir(prefix: str = "mlrepro-check-") -> Iterator[Path]:
    """A temporary folder that is also the working directory for the duration.

    The official checkers log through the root logger; without a handler Python
    would print their warnings to stderr, so logging is muted while inside.
    """
    old_cwd = os.getcwd()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    previous_disable = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        os.chdir(tmp)
        yield tmp
    finally:
        os.chdir(old_cwd)
        logging.disable(previous_disable)
        shutil.rmtree(tmp, ignore_errors=True)


def _short(msg: str) -> str:
    """One checker message, without the state dumps the checker appends."""
    lines = [ln for ln in str(msg).strip().splitlines() if ln.strip()]
    keep: list[str] = []
    for ln in lines:
        if ln.startswith("current context") or ln.startswith("current line"):
            break
        keep.append(ln.strip())
    text = " | ".join(keep) or str(msg).strip()
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


def supported_rulesets(usage: str = USAGE) -> set[str]:
    from mlperf_logging.compliance_checker.mlp_compliance import rule_choices

    root = Path(__import__("mlperf_logging.compliance_checker", fromlist=["x"]).__file__).parent
    return {r for r in rule_choices() if (root / f"{usage}_{r}").is_dir()}


# ---------------------------------------------------------------- compliance


def check_compliance(log_path: str | os.PathLike, *, ruleset: str, usage: str = USAGE,
                     in_process: bool = True) -> Verdict:
    """Run mlperf_logging's compliance checker on one clean MLLOG file.

    In-process is the default (fast: no interpreter start per log); the
    subprocess form runs ``python -m mlperf_logging.compliance_checker``
    exactly as a user would. Both run inside a scratch working directory.
    """
    log_path = Path(log_path).resolve()
    if ruleset not in supported_rulesets(usage):
        return Verdict(False, None, [f"mlperf_logging {mlperf_logging_version()} has no {usage} ruleset {ruleset}"])
    if not in_process:
        return _compliance_subprocess(log_path, ruleset, usage)
    from mlperf_logging.compliance_checker import mlp_compliance

    with scratch_dir():
        # Configs are queued in a module-level list; a checker that crashed
        # earlier could have left entries behind.
        mlp_compliance.enqueued_configs.clear()
        checker = mlp_compliance.make_checker(usage, ruleset, True, False)
        try:
            valid, _, _, _ = mlp_compliance.main(str(log_path), f"{usage}_{ruleset}/common.yaml", checker)
        except Exception as exc:  # the checker eval()s YAML rules; anything can happen
            mlp_compliance.enqueued_configs.clear()
            return Verdict(True, False, [f"compliance checker failed on this log: {type(exc).__name__}: {exc}"])
    reasons = [_short(m) for m in (*checker.overwritable.values(), *checker.not_overwritable)]
    return Verdict(True, bool(valid), [] if valid else reasons or ["compliance checker rejected the log"])


def _compliance_subprocess(log_path: Path, ruleset: str, usage: str) -> Verdict:
    with scratch_dir() as tmp:
        out = tmp / "compliance_checker.log"
        proc = run(
            [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", usage, "--ruleset", ruleset,
             "--quiet", "--log_output", str(out), str(log_path)],
            check=False, cwd=tmp,
        )
        text = out.read_text(errors="replace") if out.exists() else proc.stdout + proc.stderr
    if proc.returncode == 0:
        return Verdict(True, True, [])
    reasons = [_short(b) for b in _warning_blocks(text)] or [f"compliance checker exited with {proc.returncode}"]
    return Verdict(True, False, reasons)


def _warning_blocks(text: str) -> list[str]:
    """The messages of a checker log: each WARNING block up to the next log record."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for ln in text.splitlines():
        if ln.startswith("WARNING - "):
            current = [ln[len("WARNING - "):]]
            blocks.append(current)
        elif ln.startswith(("INFO - ", "ERROR - ")):
            current = None
        elif current is not None and ln.strip("-") != "":
            current.append(ln)
    return ["\n".join(b) for b in blocks]


# ---------------------------------------------------------------- RCP


@dataclass(frozen=True)
class RcpRun:
    """What the RCP check needs from one run."""

    converged: bool  # run_stop status == "success"
    samples_to_converge: float | None
    global_batch_size: float | None


@lru_cache(maxsize=16)
def rcp_checker_for(benchmark: str, ruleset: str, usage: str = USAGE):
    """mlperf_logging's RCP_Checker of a benchmark (its reference convergence points), built once."""
    from mlperf_logging.rcp_checker import rcp_checker

    with scratch_dir():
        return rcp_checker.RCP_Checker(usage, ruleset, benchmark, False)


def check_rcp(runs: Sequence[RcpRun], *, benchmark: str, ruleset: str, usage: str = USAGE) -> dict:
    """The RCP verdict and score scaling factor of a set of runs.

    Reference points (olympic means, allowed speed-ups, pruning, interpolation)
    come from mlperf_logging's own RCP_Checker and its RCP files; the steps
    that rcp_checker.check_directory takes on result files are re-done here
    on the runs we parsed, so nothing is read from or written to a folder.
    The factor is what the official flow writes to scaling.json: the
    normalisation factor when the check passes, 1.0 otherwise.
    """
    out = {"checked": False, "pass": None, "scaling_factor": 1.0, "reason": "", "rcp": None,
           "global_batch_size": None, "rcp_mean": None, "min_samples": None, "submission_mean": None}
    try:
        import numpy as np

        checker = rcp_checker_for(benchmark, ruleset, usage)
    except Exception as exc:  # unknown benchmark or ruleset, missing RCP file
        out["reason"] = f"no RCP data for {benchmark} in {usage} {ruleset} ({type(exc).__name__}: {exc})"
        return out
    out["checked"] = True
    out["pass"] = False
    if not runs:
        out["reason"] = "no runs to check"
        return out
    sizes = [r.global_batch_size for r in runs]
    if any(s is None for s in sizes):
        out["reason"] = "Could not detect global_batch_size (missing in some runs)"
        return out
    if len(set(sizes)) > 1:
        out["reason"] = f"Could not detect global_batch_size (runs differ: {sorted(set(sizes))})"
        return out
    bs = sizes[0]
    out["global_batch_size"] = bs
    # A run that did not converge counts as infinitely slow, as in rcp_checker.
    samples = [float(r.samples_to_converge) if r.converged and r.samples_to_converge is not None else 1e9
               for r in runs]
    if sum(1 for s in samples if s == 1e9) > (4 if benchmark == "unet3d" else 1):
        out["reason"] = "Insufficient convergence (more than one run did not converge)"
        return out

    record, msg = _rcp_record(checker, bs)
    if record is None:
        out["reason"] = msg
        return out

    rcp_mean = float(record["RCP Mean"])
    max_speedup = float(record["Max Speedup"])
    if _version_at_least(ruleset, "5.0.0") and benchmark == "llama31_405b":
        # The 5.0 rules allow one extra evaluation interval (46080 samples) of
        # speed-up for llama31_405b; rcp_checker applies it the same way.
        max_speedup = rcp_mean / (float(record["Min Epochs"]) - 46080)
    ordered = sorted(samples)
    drop = 4 if benchmark == "unet3d" else 1
    if len(ordered) <= 2 * drop:
        out["reason"] = (f"{len(ordered)} converged runs are too few for the RCP mean "
                         f"(it drops the {drop} fastest and the {drop} slowest)")
        return out
    subm_mean = float(np.mean(ordered[drop:len(ordered) - drop]))
    norm = rcp_mean / subm_mean
    norm = 1.0 if norm < 1 else float(norm)
    passed = subm_mean >= rcp_mean / max_speedup
    out.update({
        "pass": bool(passed),
        "rcp": "interpolated" if msg == "RCP Interpolation" else f"BS {record['BS']}",
        "rcp_mean": rcp_mean,
        "min_samples": rcp_mean / max_speedup,
        "submission_mean": subm_mean,
        "scaling_factor": norm if passed else 1.0,
    })
    if passed:
        out["reason"] = msg + (f"; converged faster than the RCP mean, score scaled by {norm:.6f}" if norm > 1 else "")
    else:
        out["reason"] = (f"{msg}; mean samples to converge {subm_mean:g} is below the fastest allowed "
                         f"{rcp_mean / max_speedup:g} (RCP mean {rcp_mean:g})")
    return out


def _rcp_record(checker, bs: int) -> tuple[dict | None, str]:
    """The reference record for batch size `bs` and how it was found (rcp_checker's own order:
    exact, interpolated, a smaller batch's), or None and why there is none."""
    record = checker._find_rcp(bs, "pruned_rcps")
    if record is not None:
        return record, "RCP found"
    low = checker._find_top_min_rcp(bs, "pruned_rcps")
    high = checker._find_bottom_max_rcp(bs, "pruned_rcps")
    if low is not None and high is not None:
        return checker._create_interp_rcp(bs, low, high)[1], "RCP Interpolation"
    if low is not None:
        return None, f"Missing RCP, please submit RCP with BS = {bs}"
    if high is not None:
        return checker._find_min_rcp("pruned_rcps"), "RCP not found but slower convergence on smaller batch size"
    return None, "Cannot find any RCPs"


def _version_at_least(version: str, minimum: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    a, b = parts(version), parts(minimum)
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) >= b + (0,) * (n - len(b))


def run_rcp_checker(folder: str | os.PathLike, *, ruleset: str, usage: str = USAGE) -> Verdict:
    """``python -m mlperf_logging.rcp_checker`` on a copy of `folder` (result_*.txt files)."""
    folder = Path(folder).resolve()
    with scratch_dir() as tmp:
        copy = tmp / "results"
        shutil.copytree(folder, copy)
        proc = run(
            [sys.executable, "-m", "mlperf_logging.rcp_checker", str(copy), "--rcp_usage", usage,
             "--rcp_version", ruleset, "--log_output", str(tmp / "rcp_checker.log")],
            check=False, cwd=tmp,
        )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "RCP test" in ln or "ERROR" in ln]
    return Verdict(True, proc.returncode == 0, [_short(ln) for ln in lines])


# ---------------------------------------------------------------- package


def run_package_checker(folder: str | os.PathLike, *, ruleset: str, usage: str = USAGE) -> Verdict:
    """``python -m mlperf_logging.package_checker`` on a copy of the submission `folder`
    (the <submitter> folder holding systems/ and results/)."""
    folder = Path(folder).resolve()
    with scratch_dir() as tmp:
        copy = tmp / folder.name
        shutil.copytree(folder, copy)
        log = tmp / "package_checker.log"
        proc = run(
            [sys.executable, "-m", "mlperf_logging.package_checker", str(copy), usage, ruleset,
             "--log_output", str(log)],
            check=False, cwd=tmp,
        )
        text = log.read_text(errors="replace") if log.exists() else ""
    text = text or proc.stdout + proc.stderr
    ok = proc.returncode == 0 and "PACKAGE CHECKER FOUND NO ERRORS" in text
    reasons = [] if ok else [_short(ln) for ln in text.splitlines() if ln.startswith("ERROR")]
    if not ok and not reasons:
        reasons = [f"package checker did not report success (exit {proc.returncode})"]
    return Verdict(True, ok, reasons)


def mlperf_logging_version() -> str:
    try:
        from importlib.metadata import version

        return version("mlperf-logging")
    except Exception:
        return "(unknown version)"
