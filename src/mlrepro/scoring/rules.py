"""The scoring rules of every MLPerf benchmark, read from the installed mlperf-logging.

Nothing here is typed by hand: the rulesets are the ``<usage>_<x.y.z>`` folders of
mlperf_logging's compliance checker, the benchmarks and required run counts come
from ``mlperf_logging.benchmark_meta``, the quality target from the
``ATLEAST_ONE_CHECK`` of each ``closed_<benchmark>.yaml`` (and ``open_``), and the
reference convergence points from the rcp_checker's ``rcps_<benchmark>.json``.
A newer mlperf-logging therefore brings its new rulesets and benchmarks with it.

The few rules that mlperf_logging keeps in code rather than in data files are
mirrored here with a comment naming the function they come from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

USAGE = "training"
DEFAULT_RULESET = "5.0.0"  # the round mlrepro reproduces (MLPerf Training v5.0)

# A comparison of the logged value (or one field of it) with a number, as the
# checks of the closed_<benchmark>.yaml files write them:
#   v['value'] <= 0.925      v['value']['FID'] <= 90.0      0.15 <= v['value']['CLIP']
_FIELD = r"v\[['\"]value['\"]\](?:\[['\"](?P<f{n}>\w+)['\"]\])?"
_NUM = r"(?P<n{n}>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_OP = r"(?P<o{n}><=|>=|<|>|==)"
_VALUE_OP_NUM = re.compile(_FIELD.format(n=1) + r"\s*" + _OP.format(n=1) + r"\s*" + _NUM.format(n=1))
_NUM_OP_VALUE = re.compile(_NUM.format(n=2) + r"\s*" + _OP.format(n=2) + r"\s*" + _FIELD.format(n=2))
_VALUE_OP_STATE = re.compile(_FIELD.format(n=3) + r"\s*" + _OP.format(n=3) + r"\s*s\[['\"](?P<s3>\w+)['\"]\]")
_FLIP = {"<=": ">=", ">=": "<=", "<": ">", ">": "<", "==": "=="}


class UnknownRules(ValueError):
    """mlperf_logging knows no such usage, ruleset or benchmark."""


@dataclass(frozen=True)
class Threshold:
    """One comparison in a quality check: `field` of the value `op` `value`."""

    field: str | None  # None: the value itself; else a key of a dict value (FID, CLIP, BBOX)
    op: str  # <=, >=, <, >, ==
    value: float | None  # None when compared with a state variable set from the log
    state: str | None = None  # s['target_accuracy'] and the like

    def to_dict(self) -> dict:
        return {"field": self.field, "op": self.op, "value": self.value, "state": self.state}


@dataclass(frozen=True)
class Target:
    """The quality target of one benchmark in one division, from its compliance yaml."""

    metric: str  # the log key the check is on (eval_accuracy, aggregated_eval_accuracy)
    check: str  # the official Python expression, verbatim
    thresholds: tuple[Threshold, ...]  # the goals (sanity bounds such as value < 1.0 left out)
    source: str  # the yaml file, relative to mlperf_logging

    @property
    def direction(self) -> str | None:
        """'<=' when lower is better (a loss), '>=' when higher is better; None when mixed."""
        ops = {"<=" if t.op in ("<=", "<") else ">=" if t.op in (">=", ">") else t.op for t in self.thresholds}
        return ops.pop() if len(ops) == 1 else None

    @property
    def value(self) -> float | None:
        """The target number when there is exactly one."""
        return self.thresholds[0].value if len(self.thresholds) == 1 else None

    def describe(self) -> str:
        parts = []
        for t in self.thresholds:
            name = self.metric + (f"[{t.field}]" if t.field else "")
            rhs = f"s[{t.state}]" if t.state else f"{t.value:g}"
            parts.append(f"{name} {t.op} {rhs}")
        return " and ".join(parts) or self.check

    def to_dict(self) -> dict:
        return {"metric": self.metric, "direction": self.direction, "value": self.value,
                "thresholds": [t.to_dict() for t in self.thresholds], "check": self.check, "source": self.source}


@dataclass(frozen=True)
class BenchmarkRules:
    """How MLCommons scores one benchmark of one ruleset."""

    usage: str
    ruleset: str
    benchmark: str
    required_runs: int
    # How many runs the olympic mean may lose to non-convergence (and drops at
    # each end); the RCP mean drops as many at each end.
    max_dropped_runs: int
    target: Target | None  # closed division
    open_target: Target | None
    rcp_file: str | None  # relative to mlperf_logging; None: no reference convergence points
    rcp_batch_sizes: tuple[float, ...] = ()
    # RCP check and its score scaling apply to the closed division only
    # (result_summarizer._compute_strong_scaling_scores: `if division == 'closed'`).
    rcp_divisions: tuple[str, ...] = ("closed",)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def rcp_available(self) -> bool:
        return bool(self.rcp_file and self.rcp_batch_sizes)

    def to_dict(self) -> dict:
        return {
            "usage": self.usage, "ruleset": self.ruleset, "benchmark": self.benchmark,
            "required_runs": self.required_runs, "max_dropped_runs": self.max_dropped_runs,
            "target": self.target.to_dict() if self.target else None,
            "open_target": self.open_target.to_dict() if self.open_target else None,
            "rcp_available": self.rcp_available, "rcp_file": self.rcp_file,
            "rcp_batch_sizes": list(self.rcp_batch_sizes), "rcp_divisions": list(self.rcp_divisions),
            "notes": list(self.notes),
        }


def _pkg_root() -> Path:
    import mlperf_logging

    return Path(mlperf_logging.__file__).resolve().parent


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@lru_cache(maxsize=8)
def rulesets(usage: str = USAGE) -> tuple[str, ...]:
    """Every ruleset of `usage` that mlperf_logging can check and summarize, oldest first."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    found = []
    for d in (_pkg_root() / "compliance_checker").iterdir():
        m = re.fullmatch(rf"{re.escape(usage)}_(\d+\.\d+\.\d+)", d.name)
        if not (m and d.is_dir()):
            continue
        try:
            get_allowed_benchmarks(usage, m.group(1))
        except ValueError:
            continue  # e.g. training_0.7.0_warn: a variant, not a ruleset
        found.append(m.group(1))
    return tuple(sorted(found, key=_version_key))


def _check_ruleset(usage: str, ruleset: str) -> None:
    if ruleset not in rulesets(usage):
        from mlrepro.scoring import checkers

        raise UnknownRules(f"mlperf_logging {checkers.mlperf_logging_version()} has no {usage} ruleset {ruleset!r} "
                           f"(it has {', '.join(rulesets(usage)) or 'none'})")


@lru_cache(maxsize=64)
def benchmarks(ruleset: str, usage: str = USAGE) -> tuple[str, ...]:
    """The benchmarks of `ruleset`, in mlperf_logging's order (the summarizer's column order)."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    _check_ruleset(usage, ruleset)
    return tuple(dict.fromkeys(get_allowed_benchmarks(usage, ruleset)))  # 4.0 lists one twice


def _load_yaml(path: Path) -> list:
    import yaml

    # BaseLoader, as mlp_compliance.configured_checks reads them: every scalar a string.
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)
    with open(path) as fh:
        return yaml.load(fh, Loader=loader) or []


def _thresholds(expr: str) -> tuple[Threshold, ...]:
    found: list[Threshold] = []
    for m in _VALUE_OP_NUM.finditer(expr):
        found.append(Threshold(m.group("f1"), m.group("o1"), float(m.group("n1"))))
    for m in _NUM_OP_VALUE.finditer(expr):
        found.append(Threshold(m.group("f2"), _FLIP[m.group("o2")], float(m.group("n2"))))
    for m in _VALUE_OP_STATE.finditer(expr):
        found.append(Threshold(m.group("f3"), m.group("o3"), None, m.group("s3")))
    # The checks pair each goal with sanity bounds: strict ones (v > 0.0, v < 1.0)
    # and the ends of a metric's range (v <= 1.0 for an AUC, 0.0 <= FID). Keep the
    # goals; if that would leave nothing, keep everything.
    goals = [t for t in found if t.op not in ("<", ">")]
    goals = [t for t in goals if not (t.state is None and ((t.op == "<=" and t.value == 1.0)
                                                           or (t.op == ">=" and t.value == 0.0)))]
    return tuple(goals or found)


def _target_from(path: Path, root: Path) -> Target | None:
    if not path.is_file():
        return None
    for item in _load_yaml(path):
        key = item.get("KEY") if isinstance(item, dict) else None
        if isinstance(key, dict) and "ATLEAST_ONE_CHECK" in key:
            expr = " ".join(str(key["ATLEAST_ONE_CHECK"]).split())
            return Target(str(key["NAME"]), expr, _thresholds(expr), str(path.relative_to(root)))
    return None


def _rcp_batch_sizes(path: Path, benchmark: str) -> tuple[float, ...]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ()
    return tuple(sorted({float(r["BS"]) for r in data.values()
                         if isinstance(r, dict) and r.get("Benchmark") == benchmark and "BS" in r}))


@lru_cache(maxsize=256)
def benchmark_rules(benchmark: str, ruleset: str, usage: str = USAGE) -> BenchmarkRules:
    """The rules of `benchmark` in `usage` `ruleset`; UnknownRules if mlperf_logging has none."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    if benchmark not in benchmarks(ruleset, usage):
        raise UnknownRules(f"{benchmark!r} is not a benchmark of MLPerf {usage} {ruleset} "
                           f"(its benchmarks: {', '.join(benchmarks(ruleset, usage))})")
    root = _pkg_root()
    cc = root / "compliance_checker" / f"{usage}_{ruleset}"
    rcp = root / "rcp_checker" / f"{usage}_{ruleset}" / f"rcps_{benchmark}.json"
    notes = []
    # result_summarizer._compute_strong_score_standalone: `max_dropped_scores = 4 if
    # benchmark == "unet3d" else 1`; rcp_checker drops as many (`samples_rejected`).
    max_dropped = 4 if benchmark == "unet3d" else 1
    if max_dropped != 1:
        notes.append(f"olympic mean drops {max_dropped} runs at each end (result_summarizer)")
    if benchmark == "llama31_405b" and _version_key(ruleset) >= (5, 0, 0):
        notes.append("RCP allows one more evaluation interval (46080 samples) of speed-up "
                     "(rcp_checker.RCP_Checker._eval_submission_record)")
    if benchmark == "stable_diffusion":
        notes.append("RCP samples to converge: the first evaluation with FID <= 90 and CLIP >= 0.15 "
                     "(rcp_checker.read_submission_file)")
    return BenchmarkRules(
        usage=usage, ruleset=ruleset, benchmark=benchmark,
        required_runs=int(get_result_file_counts(usage)[benchmark]),
        max_dropped_runs=max_dropped,
        target=_target_from(cc / f"closed_{benchmark}.yaml", root),
        open_target=_target_from(cc / f"open_{benchmark}.yaml", root),
        rcp_file=str(rcp.relative_to(root)) if rcp.is_file() else None,
        rcp_batch_sizes=_rcp_batch_sizes(rcp, benchmark) if rcp.is_file() else (),
        notes=tuple(notes),
    )


def all_rules(usage: str = USAGE) -> dict[str, dict[str, BenchmarkRules]]:
    """{ruleset: {benchmark: rules}} for every ruleset mlperf_logging knows."""
    return {rs: {b: benchmark_rules(b, rs, usage) for b in benchmarks(rs, usage)} for rs in rulesets(usage)}


def rules_table(usage: str = USAGE, ruleset: str | None = None):
    """A pandas DataFrame, one row per ruleset and benchmark."""
    import pandas as pd

    rows = []
    for rs, per in all_rules(usage).items():
        if ruleset and rs != ruleset:
            continue
        for b, r in per.items():
            rows.append({
                "ruleset": rs, "benchmark": b, "required_runs": r.required_runs,
                "max_dropped_runs": r.max_dropped_runs,
                "metric": r.target.metric if r.target else None,
                "target": r.target.describe() if r.target else None,
                "direction": r.target.direction if r.target else None,
                "rcp": r.rcp_available, "rcp_batch_sizes": len(r.rcp_batch_sizes),
            })
    return pd.DataFrame(rows)




def as_jsonable(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj
