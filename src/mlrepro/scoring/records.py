"""The records a reproduction writes, typed: a seed's run record (run.json), the score (score.json)
and the verdict (verdict.json).

Each record is built by its constructor only, read by `from_json` (`read(path)` for a file) and
written whole by `to_json` (`write(path)`, one atomic write). On disk they keep the keys every
earlier version wrote, so results written before these types existed read back unchanged, and a
key this version does not know (an older or newer writer's) is kept as read, never refused.

A key that a record does not hold is ABSENT, not None: None is written as null, and which keys a
record holds says what made it (the official tools' run records carry `flags` and `time_ms`,
Megatron-LM's `source`, `throughput` and `curve`, a seed the early stop did not run `stopped`).
Changes after scoring (a chained seed's segments, a log changed after its seed finished, the loss
band) are methods that give a new record; nothing patches a record's JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

# ABSENT is imported from here by the scoring modules; the sentinel and the base are util's.
from mlrepro.util.records import ABSENT, Record


# ---------------------------------------------------------------- run.json

# What scored a run: which keys its record holds, and (OFFICIAL) whether score_runs takes the
# official summarizer's verdict on it.
MLLOG = "mllog"  # mlrepro's reading of MLLOG: a benchmark without a ruleset, or compliance skipped
OFFICIAL = "official"  # mlperf_logging's result_summarizer and compliance checker (scoring.engine)
MEGATRON = "megatron"  # a Megatron-LM/NeMo training log (scoring.megatron_score)
STOPPED = "stopped"  # no run: the early stop settled the reproduction before the seed started


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord(Record):
    """A seed's (or a log's) run record: run.json, and each entry of score.json's `runs`."""

    scorer: str  # MLLOG, OFFICIAL, MEGATRON or STOPPED; not a key: the keys a record holds say it
    file: str | None = ABSENT
    seed: int | None = ABSENT
    benchmark: str | None = ABSENT
    source: str | None = ABSENT  # MEGATRON: "megatron" or "nemo", the log's dialect
    stopped: bool = ABSENT  # STOPPED
    minutes: float | None = ABSENT
    time_ms: float | None = ABSENT  # OFFICIAL: the summarizer's own run time
    status: str | None = ABSENT
    evals: list[list[float]] = ABSENT
    target_reached: bool = ABSENT
    converged: bool = ABSENT
    samples_to_converge: float | None = ABSENT
    iteration_to_converge: int | None = ABSENT  # MEGATRON
    global_batch_size: float | None = ABSENT
    compliance: dict[str, Any] = ABSENT
    counted: bool = ABSENT
    flags: list[str] = ABSENT  # OFFICIAL (what the official tools do not check), and a left loss band
    reasons: list[str] = ABSENT
    problems: list[str] = ABSENT
    mllog_sha256: str | None = ABSENT
    throughput: dict[str, Any] = ABSENT  # MEGATRON
    curve: list[list[float]] = ABSENT  # MEGATRON: [[iteration, training loss], ...]
    fingerprint: str | None = ABSENT
    # Set after scoring: by the score stage (segments, changed_after_finish), the loss-band check
    # (loss_band), score_runs in score.json (duplicate).
    segments: list[dict[str, Any]] = ABSENT
    changed_after_finish: dict[str, str] = ABSENT
    loss_band: dict[str, Any] = ABSENT
    duplicate: bool = ABSENT

    _NOT_KEYS: ClassVar[frozenset[str]] = frozenset({"extra", "scorer"})

    @classmethod
    def from_json(cls, data: dict, scorer: str | None = None) -> RunRecord:
        """The record of a run.json (or of a score's `runs`); `scorer` when the caller knows it, else
        the keys say it. The keys are the one place that tells scorers apart on disk: run.json has
        never held the scorer's name, and the files already written must read the same."""
        fields = cls._fields_of(data)
        if scorer is None:
            scorer = (STOPPED if data.get("stopped") else MEGATRON if "source" in data or "throughput" in data
                      else OFFICIAL if "flags" in data else MLLOG)
        return cls(scorer=scorer, **fields)

    @classmethod
    def of(cls, run: RunRecord | dict) -> RunRecord:
        """A record as it is, or read from its JSON (a run.json read back, a dict made by a caller)."""
        return run if isinstance(run, RunRecord) else cls.from_json(run)

    @classmethod
    def not_run(cls, seed: int, why: str) -> RunRecord:
        """A seed the early stop settled before it started: no run, and why."""
        return cls(scorer=STOPPED, seed=seed, stopped=True, counted=False, minutes=None, reasons=[why])

    def with_segments(self, segments: list[dict[str, Any]]) -> RunRecord:
        """The record of a seed run as a chain of time-limited jobs (one job: no segments)."""
        return self.replace(segments=list(segments)) if segments else self

    def changed_after(self, why: str, rerun: str) -> RunRecord:
        """A seed whose log changed after it finished: not counted, saying why and how to get the run back."""
        return self.replace(changed_after_finish={"reason": why, "rerun": rerun}, counted=False,
                            reasons=[*(self.reasons or []), f"{why}; redo the seed: {rerun}"])

    def with_loss_band(self, band: dict[str, Any], left_band: str | None) -> RunRecord:
        """The record with its training loss checked against a reference band; `left_band`, the
        message when the loss leaves it, is flagged."""
        flags = self.flags if left_band is None else [*(self.flags or []), left_band]
        return self.replace(loss_band=band, flags=flags)


# ---------------------------------------------------------------- score.json


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreRecord(Record):
    """A benchmark's runs scored together: score.json, `mlrepro score --json`, a reference's score."""

    benchmark: str = ABSENT
    mlperf_benchmark: str | None = ABSENT
    ruleset: str | None = ABSENT
    required_runs: int = ABSENT
    target: dict[str, Any] = ABSENT
    runs: list[RunRecord] = ABSENT
    runs_counted: int = ABSENT
    runs_failed: int = ABSENT
    olympic_minutes: float | None = ABSENT
    rcp: dict[str, Any] = ABSENT
    score_minutes: float | None = ABSENT
    energy: dict[str, Any] = ABSENT
    valid: bool = ABSENT
    reasons: list[str] = ABSENT
    tools: dict[str, Any] = ABSENT
    # A reproduction's (the score stage's): what it cost, its running verdict, its early stop, and
    # the seeds whose log changed after they finished.
    cost: dict[str, Any] = ABSENT
    running_verdict: dict[str, Any] = ABSENT
    complete_mlperf_result: bool = ABSENT
    early_stop: dict[str, Any] = ABSENT
    changed_after_finish: list[dict[str, Any]] = ABSENT
    # The effective training time, per seed and in all, with its lost time by cause (scoring.goodput).
    goodput: dict[str, Any] | None = ABSENT

    @classmethod
    def _from_json_values(cls, known: dict[str, Any]) -> dict[str, Any]:
        if isinstance(known.get("runs"), list):
            known["runs"] = [RunRecord.from_json(r) for r in known["runs"]]
        return known

    def _to_json_value(self, key: str, value: Any) -> Any:
        return [r.to_json() for r in value] if key == "runs" else value


# ---------------------------------------------------------------- verdict.json


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerdictRecord(Record):
    """A benchmark's score against its reference (mlrepro.scoring.verdict): verdict.json."""

    benchmark: str = ABSENT
    mlperf_benchmark: str | None = ABSENT
    system: dict[str, Any] = ABSENT
    reference: dict[str, Any] = ABSENT
    method: str = ABSENT
    alpha: float = ABSENT
    tolerance_pct: float = ABSENT
    valid: bool = ABSENT
    reasons: list[str] = ABSENT
    score_minutes: float | None = ABSENT
    reference_score_minutes: float | None = ABSENT
    reference_valid: bool | None = ABSENT
    difference_pct: float | None = ABSENT
    rcp_factor: float | None = ABSENT
    reference_rcp_factor: float | None = ABSENT
    rcp_factor_difference_pct: float | None = ABSENT
    seeds: dict[str, Any] = ABSENT
    reference_seeds: dict[str, Any] = ABSENT
    runs: dict[str, list[float]] = ABSENT
    environment: dict[str, Any] = ABSENT
    tests: dict[str, Any] = ABSENT
    # What the runs can tell at their counts and spread (mlrepro.scoring.verdict.power); None: too few to test
    power: dict[str, Any] | None = ABSENT
    verdict: str = ABSENT
    why: list[str] = ABSENT
    # A reproduction's: the implementation config its runs used, and what its score carries.
    config: dict[str, Any] | None = ABSENT
    cost: dict[str, Any] = ABSENT
    running_verdict: dict[str, Any] = ABSENT
    complete_mlperf_result: bool = ABSENT
    early_stop: dict[str, Any] = ABSENT
    goodput: dict[str, Any] | None = ABSENT
