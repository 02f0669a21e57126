"""mlrepro.scoring.integrity: what mlrepro checks beyond the official tools (issue 26): plausible times,
evaluations inside the timed run, one run per log, copies of a run whatever seed they log."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from mlrepro.scoring import integrity


# ---------------------------------------------------------------- integrity: MLLOG

@dataclass
class Rec:
    key: str
    time_ms: float
    value: object = None
    metadata: dict = field(default_factory=dict)
    lineno: int = 1


T0 = 1_745_000_000_000


@pytest.mark.parametrize("start, stop, word", [
    (T0, 1e300, "not a time between 2000 and 2100"), (-1000, T0, "not a time between"), (0, T0, "not a time"),
    (T0, T0, "not after run_start"), (T0, T0 - 1, "not after run_start"), (T0, 5e12, "not a time between"),
])
def test_run_times_that_are_no_time(start, stop, word):
    why = integrity.run_time_problems(Rec("run_start", start), Rec("run_stop", stop))
    assert why and word in why[0]
    if "between" in word:
        assert integrity.STRICTER in why[0]


def test_a_real_run_time_passes():
    assert integrity.run_time_problems(Rec("run_start", T0), Rec("run_stop", T0 + 60_000)) == []


def test_evaluations_outside_the_run_or_out_of_time_order_do_not_count():
    start, stop = Rec("run_start", T0), Rec("run_stop", T0 + 1000)
    window = [Rec("eval_accuracy", T0 + 100, 3.0, lineno=2), Rec("eval_accuracy", T0 + 50, 2.0, lineno=3),
              Rec("eval_accuracy", T0 + 500, 1.0, lineno=4), Rec("eval_accuracy", T0 + 5000, 0.5, lineno=5),
              Rec("other", T0 + 9999, lineno=6)]
    kept, problems = integrity.evaluations_in_time(window, "eval_accuracy", start, stop)
    assert [r.lineno for r in kept] == [2, 4]
    assert "line 3 is stamped before the one at line 2" in problems[0]
    assert "line 5 is stamped after run_stop" in problems[1]
    assert all(integrity.STRICTER in p for p in problems)


def test_fingerprint_ignores_the_seed_and_a_shifted_clock():
    def run(t0, values=(3.0, 2.5, 2.0)):
        evals = [Rec("eval_accuracy", t0 + 100 * (i + 1), v, {"samples_count": 16 * (i + 1)}) for i, v in enumerate(values)]
        return integrity.fingerprint(evals, Rec("run_start", t0), Rec("run_stop", t0 + 1000))
    assert run(T0) == run(T0 + 86_400_000)
    assert run(T0) != run(T0, values=(3.0, 2.5, 2.000001))
    assert integrity.fingerprint([], Rec("run_start", T0), Rec("run_stop", T0 + 1)) is None
    # Two evaluations of a short synthetic run can coincide to the millisecond across real runs.
    assert run(T0, values=(3.0, 2.0)) is None


def test_mark_duplicates_says_which_rule_and_why():
    runs = [{"file": "a", "seed": 1, "mllog_sha256": "s1", "fingerprint": "f1", "counted": True, "reasons": []},
            {"file": "b", "seed": 2, "mllog_sha256": "s2", "fingerprint": "f1", "counted": True, "reasons": []},
            {"file": "c", "seed": 3, "mllog_sha256": "s1", "fingerprint": "f1", "counted": True, "reasons": []},
            {"file": "d", "seed": 1, "mllog_sha256": "s4", "fingerprint": "f4", "counted": True, "reasons": []},
            {"file": "e", "seed": 5, "mllog_sha256": "s5", "fingerprint": None, "counted": True, "reasons": []}]
    integrity.mark_duplicates(runs)
    assert [r["duplicate"] for r in runs] == [False, True, True, True, False]
    assert "the same run as a" in runs[1]["reasons"][0] and integrity.STRICTER in runs[1]["reasons"][0]
    assert "identical to a" in runs[2]["reasons"][0]
    assert "duplicate seed 1" in runs[3]["reasons"][0]
    assert not any(r["counted"] for r in runs[1:4])


@pytest.mark.parametrize("minutes, ok", [(1.5, True), (None, True), (0, False), (-268.1, False),
                                         (float("nan"), False), (float("inf"), False), ("5", False), (True, False)])
def test_untrusted_time(minutes, ok):
    assert (integrity.untrusted_time({"minutes": minutes}) is None) == ok


# ---------------------------------------------------------------- integrity: Megatron logs

@dataclass
class It:
    iteration: int
    time: datetime | None
    train_iters: int | None = 100
    lm_loss: float | None = 5.0


@dataclass
class Val:
    iteration: int
    loss: float


@dataclass
class Log:
    iterations: list
    validations: list = field(default_factory=list)
    start: datetime | None = None
    starts: list = field(default_factory=list)


D0 = datetime(2026, 11, 23, 19, 30)


def iters(*numbers, step=10):
    return [It(n, D0 + timedelta(seconds=step * i + 1)) for i, n in enumerate(numbers)]


def test_one_run_in_order_has_no_problem():
    log = Log(iters(1, 10, 20), [Val(10, 4.0), Val(20, 3.0), Val(20, 2.9)], start=D0, starts=[D0])
    assert integrity.training_log_problems(log) == [] and integrity.validation_problems(log) == []


@pytest.mark.parametrize("log, word", [
    (Log(iters(1, 10, 20), start=D0, starts=[D0, D0]), "more than one run: 2"),
    (Log(iters(1, 10, 20, 1, 10), start=D0, starts=[D0]), "goes back from 20 to 1"),
    (Log(iters(1, 20, 10), start=D0, starts=[D0]), "goes back from 20 to 10"),
    (Log([It(1, D0 + timedelta(seconds=5)), It(10, D0 + timedelta(seconds=2))], start=D0, starts=[D0]),
     "stamped before iteration 1"),
    (Log(iters(1, 10), start=D0 + timedelta(hours=1), starts=[D0 + timedelta(hours=1)]), "start of training"),
    (Log([It(1, D0, 100), It(10, D0, 300)], start=None), "count to 100 and 300"),
])
def test_a_log_that_is_not_one_run_in_order(log, word):
    why = integrity.training_log_problems(log)
    assert why and word in why[0], why


@pytest.mark.parametrize("validations, word", [
    ([Val(10, -1.0)], "not a positive number"), ([Val(10, 0.0)], "not a positive number"),
    ([Val(20, 3.0), Val(10, 4.0)], "out of order"), ([Val(500, 3.0)], "never reaches"),
])
def test_validations_that_cannot_be_believed(validations, word):
    why = integrity.validation_problems(Log(iters(1, 10, 20), validations, start=D0))
    assert why and word in why[0], why


def test_training_fingerprint_is_the_same_for_a_copy():
    a = Log(iters(1, 10), [Val(10, 4.0)], start=D0)
    shifted = Log([It(i.iteration, i.time + timedelta(days=3)) for i in a.iterations], [Val(10, 4.0)],
                  start=D0 + timedelta(days=3))
    assert integrity.training_fingerprint(a) == integrity.training_fingerprint(shifted)
    assert integrity.training_fingerprint(Log(iters(1, 10, step=11), [Val(10, 4.0)], start=D0)) != \
        integrity.training_fingerprint(a)
    assert integrity.training_fingerprint(Log(iters(1), start=D0)) is None


def test_official_parser_lines_are_checked_the_same(tmp_path):
    """A scorer that reads logs with mlperf_logging's parser hands its LogLines to the same checks."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    import logs_factory as lf

    path = tmp_path / "result_0.txt"
    path.write_text(lf.run_text("mini_lora", seed=3, minutes=5.0))
    lines, errors = parse_file(str(path), ruleset="5.0.0")
    events = [integrity.event_of(line) for line in lines]
    start = next(e for e in events if e.key == "run_start")
    stop = next(e for e in events if e.key == "run_stop")
    assert not errors and integrity.run_time_problems(start, stop) == []
    kept, problems = integrity.evaluations_in_time(events, "eval_accuracy", start, stop)
    assert len(kept) == 4 and problems == []
    assert integrity.fingerprint(kept, start, stop) is not None
