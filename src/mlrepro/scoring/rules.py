"""The scoring rules of every MLPerf benchmark, read from the installed mlperf-logging.

Nothing here is typed by hand: the rulesets are the ``<usage>_<x.y.z>`` folders of
mlperf_logging's compliance checker, the benchmarks and required run counts come
from ``mlperf_logging.benchmark_meta``, the quality target from the
``ATLEAST_ONE_CHECK`` of each ``closed_<benchmark>.yaml`` (and ``open_``), and the
reference convergence points from the rcp_checker's ``rcps_<benchmark>.json``.
A newer mlperf-logging therefore brings its new rulesets and benchmarks with it.

The few rules that mlperf_logging keeps in code rather than in data files are
mirrored here with a comment naming the function they come from.

Below them, ``Rules``: how mlrepro scores one benchmark's runs (``rules_for`` a name,
``for_benchmark`` a configured benchmark): an MLPerf benchmark with the facts above, any
other with the generic checks and the target its config states.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mlrepro.scoring import checkers
from mlrepro.scoring.mllog import finite

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


# ---------------------------------------------------------------- how mlrepro scores one benchmark

# Our config names for the MLPerf benchmarks.
ALIASES = {
    "llama2_lora": "llama2_70b_lora",
    "llama2_70b": "llama2_70b_lora",
    "llama31": "llama31_405b",
    "llama3_405b": "llama31_405b",
    "llama31_405b_pretrain": "llama31_405b",
}
# Quality targets of the MLPerf Training 5.0 rules (also enforced by the
# compliance checker's closed_<benchmark>.yaml).
MLPERF_TARGETS = {
    "llama2_70b_lora": ("eval_accuracy", 0.925, "<="),
    "llama31_405b": ("eval_accuracy", 5.6, "<="),
}
_DIRECTIONS = {
    "<=": "<=", "le": "<=", "lower": "<=", "min": "<=", "minimize": "<=", "below": "<=", "lower_is_better": "<=",
    ">=": ">=", "ge": ">=", "higher": ">=", "max": ">=", "maximize": ">=", "above": ">=", "higher_is_better": ">=",
}


class RulesError(ValueError):
    """A benchmark cannot be scored with what we were told about it."""


@dataclass(frozen=True)
class Rules:
    """How one benchmark is scored."""

    benchmark: str  # the name the user gave (our config name or the MLPerf name)
    mlperf_benchmark: str | None  # None: no MLPerf ruleset applies (mini_lora)
    ruleset: str | None
    required_runs: int
    target_metric: str
    target_value: float | None  # None: a target of several numbers (stable_diffusion's FID and CLIP)
    target_direction: str | None  # "<=" or ">="
    max_failed_runs: int = 1
    usage: str = "training"
    target_check: str | None = None  # the target as mlperf_logging's compliance rules state it

    def target_met(self, value: Any) -> bool:
        value = finite(value)
        if value is None or self.target_value is None:
            return False
        if self.mlperf_benchmark:
            # the closed-division check also requires a positive metric
            if value <= 0:
                return False
        return value <= self.target_value if self.target_direction == "<=" else value >= self.target_value

    @property
    def target(self) -> dict:
        out = {"metric": self.target_metric, "value": self.target_value, "direction": self.target_direction}
        return dict(out, check=self.target_check) if self.target_check else out




def _parse_target(target: Any) -> tuple[str, float, str]:
    if isinstance(target, str):
        m = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*", target)
        if not m:
            raise RulesError(f"target {target!r} is not METRIC<=VALUE or METRIC>=VALUE")
        return m.group(1), float(m.group(3)), m.group(2)
    if isinstance(target, dict):
        try:
            metric, value = str(target["metric"]), float(target["value"])
        except (KeyError, TypeError, ValueError):
            raise RulesError(f"target {target!r} needs 'metric' and a numeric 'value'") from None
        direction = _DIRECTIONS.get(str(target.get("direction", "<=")).strip().lower())
        if direction is None:
            raise RulesError(f"target direction {target.get('direction')!r} is not one of <=, >=, min, max")
        return metric, value, direction
    if isinstance(target, (tuple, list)) and len(target) == 3:
        return _parse_target({"metric": target[0], "value": target[1], "direction": target[2]})
    raise RulesError(f"cannot read a target from {target!r}")


def rules_for(benchmark: str, *, ruleset: str | None = None, required_runs: int | None = None,
              target: Any = None) -> Rules:
    """The scoring rules of `benchmark`.

    MLPerf benchmarks (llama2_70b_lora, llama31_405b, or our names for them such
    as llama2_lora) get their facts from mlperf_logging and the MLPerf rules;
    explicit `required_runs`/`target` override them. Any other benchmark is
    scored with the generic checks and needs `target` (a dict
    {metric, value, direction}, or "metric<=value"); `required_runs` defaults to 10.
    """
    name = str(benchmark).strip()
    mlperf = ALIASES.get(name, name)
    if is_mlperf(mlperf, ruleset):
        ruleset = ruleset or DEFAULT_RULESET
        if ruleset not in checkers.supported_rulesets():
            raise RulesError(f"mlperf_logging has no training ruleset {ruleset!r}")
        from mlperf_logging.benchmark_meta import get_allowed_benchmarks, get_result_file_counts

        if mlperf not in get_allowed_benchmarks("training", ruleset):
            raise RulesError(f"{mlperf} is not a benchmark of MLPerf Training {ruleset}")
        runs = required_runs or get_result_file_counts("training")[mlperf]
        official = benchmark_rules(mlperf, ruleset)
        metric, value, direction = _parse_target(target) if target is not None else _mlperf_target(mlperf, ruleset)
        check = official.target.describe() if target is None and official.target else None
        # unet3d's 40 runs may lose 4 (result_summarizer's max_dropped_scores), the others 1
        return Rules(name, mlperf, ruleset, int(runs), metric, value, direction,
                     max_failed_runs=official.max_dropped_runs, target_check=check)
    if ruleset:
        raise RulesError(f"{name} is not an MLPerf benchmark, so it has no ruleset (got --ruleset {ruleset})")
    if target is None:
        raise RulesError(f"no target known for benchmark {name!r}: give one (e.g. --target eval_loss<=3.5)")
    metric, value, direction = _parse_target(target)
    runs = int(required_runs) if required_runs else 10
    if runs < 1:
        raise RulesError("required runs must be at least 1")
    # The olympic mean needs three runs; with fewer, every run counts and none may fail.
    return Rules(name, None, None, runs, metric, value, direction, max_failed_runs=1 if runs >= 3 else 0)


def is_mlperf(name: str, ruleset: str | None = None) -> bool:
    """Whether `name` (an MLPerf name, after ALIASES) is a benchmark of the ruleset (default DEFAULT_RULESET)."""
    if name in MLPERF_TARGETS:
        return True
    try:
        return name in benchmarks(ruleset or DEFAULT_RULESET)
    except UnknownRules:
        return False


def _mlperf_target(benchmark: str, ruleset: str) -> tuple[str, float | None, str | None]:
    """The target of the ruleset's closed_<benchmark>.yaml; value and direction are None for a target
    of several numbers (FID and CLIP, BBOX and SEGM), which the compliance checker holds runs to."""
    t = benchmark_rules(benchmark, ruleset).target
    if t is None:
        raise RulesError(f"{benchmark} in {ruleset} has no quality target in mlperf_logging's compliance rules")
    return t.metric, t.value, t.direction


def for_benchmark(bench) -> Rules:
    """The scoring rules of a configured benchmark (a mlrepro.config.Benchmark)."""
    return rules_for(bench.mlperf_benchmark or bench.name, ruleset=bench.ruleset,
                     required_runs=bench.required_runs, target=bench.target)
