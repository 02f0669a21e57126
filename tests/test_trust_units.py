"""Unit tests of the checks issue 26 adds as modules of their own: mlrepro.util.safe_yaml (alias
bombs, strict UTF-8, repeated keys), mlrepro.util.confine (paths inside their root) and
mlrepro.scoring.integrity (times, one run per log, copies of a run)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from mlrepro.scoring import integrity
from mlrepro.util import confine, safe_yaml


# ---------------------------------------------------------------- safe_yaml

def bomb(levels: int, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 9, 30])
def test_an_alias_bomb_is_refused_at_once(levels):
    start = time.monotonic()
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: its aliases"):
        safe_yaml.loads(bomb(levels), "f.yaml")
    assert time.monotonic() - start < 1.0


def test_aliases_that_stay_small_load_as_plain_yaml():
    text = "base: &b {lr: 0.1, steps: [1, 2]}\nrun1: *b\nrun2: {<<: *b, lr: 0.2}\n" + bomb(3)
    data = safe_yaml.loads(text, "f.yaml")
    assert data["run1"] == {"lr": 0.1, "steps": [1, 2]} and data["run2"]["lr"] == 0.2
    assert len(data["l2"]) == 10 and data["l2"][0][0] == ["x"] * 10


def test_the_limit_counts_expanded_values():
    assert safe_yaml.expanded_size(safe_yaml._StrictLoader(bomb(4)).get_single_node()) > 10_000
    with pytest.raises(safe_yaml.YamlError):
        safe_yaml.loads(bomb(4), "f.yaml", max_values=10_000)
    assert safe_yaml.loads(bomb(4), "f.yaml", max_values=20_000)["l0"] == ["x"] * 10


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: *a}", "- &x [1, [2, *x]]"])
def test_a_recursive_alias_is_refused(text):
    with pytest.raises(safe_yaml.YamlError, match="recursive alias"):
        safe_yaml.loads(text, "f.yaml")


def test_a_repeated_key_and_bad_yaml_name_the_file():
    with pytest.raises(safe_yaml.YamlError, match=r"f.yaml: .*key 'a' is given twice \(lines 1 and 3\)"):
        safe_yaml.loads("a: 1\nb: 2\na: 3\n", "f.yaml")
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: not valid YAML"):
        safe_yaml.loads("a: [1, 2\n", "f.yaml")


def test_a_control_character_names_the_file():
    """Found by the property tests: PyYAML's reader refuses a NUL when the loader is made."""
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: not valid YAML: unacceptable character #x0000"):
        safe_yaml.loads("a: 1\n# \x00\n", "f.yaml")


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: nested too deeply"):
        safe_yaml.loads("[" * 20_000 + "]" * 20_000, "f.yaml")


def test_files_strict_utf8_empty_and_not_regular(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nname: caf\xe9\n")
    with pytest.raises(safe_yaml.YamlError, match=r"bad.yaml: not UTF-8 text \(byte 0xe9 at line 2, column 10\)"):
        safe_yaml.load_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    assert safe_yaml.load_file(empty) is None
    with pytest.raises(safe_yaml.YamlError, match="missing.yaml: file not found"):
        safe_yaml.load_file(tmp_path / "missing.yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(safe_yaml.YamlError, match="fifo.yaml: not a regular file"):
        safe_yaml.load_file(fifo)


# ---------------------------------------------------------------- confine

@pytest.mark.parametrize("relative, inside", [
    ("scripts/download.py", True), ("./a/../b.py", True), ("a/b/../../c", True),
    ("../x", False), ("a/../../x", False), ("/bin/true", False), ("", False), ("a\x00b", False), ("..", False),
])
def test_paths_that_stay_inside(tmp_path, relative, inside):
    assert (confine.outside(tmp_path, relative) is None) == inside


def test_a_link_out_of_the_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "out.py").symlink_to("/bin/true")
    (tmp_path / "root" / "in.py").symlink_to(tmp_path / "root" / "real.py")
    assert "resolves to" in confine.outside(tmp_path / "root", "out.py")
    assert confine.outside(tmp_path / "root", "in.py") is None


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
    def run(t0, values=(3.0, 2.0)):
        evals = [Rec("eval_accuracy", t0 + 100 * (i + 1), v, {"samples_count": 16 * (i + 1)}) for i, v in enumerate(values)]
        return integrity.fingerprint(evals, Rec("run_start", t0), Rec("run_stop", t0 + 1000))
    assert run(T0) == run(T0 + 86_400_000)
    assert run(T0) != run(T0, values=(3.0, 2.000001))
    assert integrity.fingerprint([], Rec("run_start", T0), Rec("run_stop", T0 + 1)) is None


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
