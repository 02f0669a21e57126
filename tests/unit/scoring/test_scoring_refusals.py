"""Issue 37, items 1-3: a second seed in an MLPerf log, a negative evaluation loss, and run records
that say a run was not scored while counting it. Each case is cut from a published or reference log."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import logs_factory as lf
from mlrepro.scoring import score as scoring
from mlrepro.scoring.rules import rules_for

ROOT = Path(__file__).resolve().parents[3]
LORA = ROOT / "tests/fixtures/training_results_v5.0/NVIDIA/results/nyx_n1_ngc25.04_nemo/llama2_70b_lora"
MINI_REFERENCE = ROOT / "implementations/mini_lora/reference"
# mini_lora as config/benchmarks/mini_lora.yaml scores it: eval_accuracy is its evaluation loss
MINI = rules_for("mini_lora", required_runs=3, target={"metric": "eval_accuracy", "value": 0.925, "direction": "below"})
EVAL_VALUE = re.compile(r'("key": "eval_accuracy", "value": )[-+0-9.eE]+')


def copy_runs(source: Path, dest: Path, n: int = 3) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy(source / f"result_{i}.txt", dest / f"result_{i}.txt")) for i in range(n)]


def edit(path: Path, change) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(change(lines)))


def index_of(lines: list[str], key: str, last: bool = False) -> int:
    found = [i for i, ln in enumerate(lines) if f'"key": "{key}"' in ln]
    return found[-1] if last else found[0]


def second_seed(lines: list[str]) -> list[str]:
    at = index_of(lines, "seed")
    other = re.sub(r'("key": "seed", "value": )\d+', r"\g<1>1234", lines[at])
    return lines[:at + 1] + [other] + lines[at + 1:]


def last_loss(value: float):
    def change(lines: list[str]) -> list[str]:
        at = index_of(lines, "eval_accuracy", last=True)
        lines[at] = EVAL_VALUE.sub(rf"\g<1>{value!r}", lines[at])
        return lines
    return change


# ---------------------------------------------------------------- item 1: a second seed


def test_a_second_seed_in_a_published_log_is_not_valid(tmp_path):
    runs = copy_runs(LORA, tmp_path / "lora")
    rules = rules_for("llama2_lora", required_runs=3)
    assert scoring.score_runs(runs, rules)["valid"]  # as published: 11.235 min, VALID
    for path in runs[:2]:
        edit(path, second_seed)
    score = scoring.score_runs(runs, rules)
    assert not score["valid"]
    for run in score["runs"][:2]:
        assert any("2 different seeds" in r and "not scored" in r for r in run["reasons"]), run["reasons"]
        assert run["counted"] is False and run["converged"] is False
    assert score["runs"][2]["counted"] and not score["runs"][2]["reasons"]


# ---------------------------------------------------------------- item 2: a negative loss


def test_a_negative_evaluation_loss_is_not_scored(tmp_path):
    runs = copy_runs(MINI_REFERENCE, tmp_path / "mini")
    rules = MINI
    assert scoring.score_runs(runs, rules)["valid"]
    for path in runs[:2]:
        edit(path, last_loss(-0.5))
    score = scoring.score_runs(runs, rules)
    assert not score["valid"]
    for run in score["runs"][:2]:
        assert any("-0.5" in r and "not scored" in r for r in run["reasons"]), run["reasons"]
        assert run["counted"] is False and run["converged"] is False


def test_a_loss_that_is_not_finite_is_not_scored(tmp_path):
    (path,) = copy_runs(MINI_REFERENCE, tmp_path / "mini", n=1)
    edit(path, lambda lines: [EVAL_VALUE.sub(r"\g<1>NaN", ln, count=1) if i == index_of(lines, "eval_accuracy")
                              else ln for i, ln in enumerate(lines)])
    run = scoring.score_run(path, MINI)
    assert any("NaN" in r and "not scored" in r for r in run["reasons"]), run["reasons"]
    assert run["counted"] is False and run["converged"] is False


# ---------------------------------------------------------------- item 3: records that contradict themselves


def test_a_published_log_with_two_run_starts_is_neither_counted_nor_converged(tmp_path):
    (path,) = copy_runs(LORA, tmp_path / "lora", n=1)
    edit(path, lambda lines: lines[:index_of(lines, "run_start") + 1] + lines[index_of(lines, "run_start"):])
    run = scoring.score_run(path, rules_for("llama2_lora", required_runs=3))
    assert any("more than one run" in r for r in run["reasons"])
    assert run["counted"] is False and run["converged"] is False


OPS = ["dup_run_start", "dup_run_stop", "appended_twice", "second_seed", "wrong_benchmark", "negative_loss",
       "nan_loss", "dup_line", "drop_line"]


def corrupt(lines: list[str], ops) -> list[str]:
    for op, where in ops:
        at = min(int(where * len(lines)), len(lines) - 1)
        if op in ("dup_run_start", "dup_run_stop"):
            key = op[4:]
            if any(f'"key": "{key}"' in ln for ln in lines):
                i = index_of(lines, key)
                lines = lines[:i + 1] + [lines[i]] + lines[i + 1:]
        elif op == "appended_twice":
            lines = lines + lines
        elif op == "second_seed" and any('"key": "seed"' in ln for ln in lines):
            lines = second_seed(lines)
        elif op == "wrong_benchmark":
            lines = [re.sub(r'("key": "submission_benchmark", "value": )"[^"]*"', r'\g<1>"bert"', ln)
                     for ln in lines]
        elif op in ("negative_loss", "nan_loss"):
            evals = [i for i, ln in enumerate(lines) if '"key": "eval_accuracy"' in ln]
            if evals:
                i = evals[min(int(where * len(evals)), len(evals) - 1)]
                lines[i] = EVAL_VALUE.sub(r"\g<1>-0.5" if op == "negative_loss" else r"\g<1>NaN", lines[i])
        elif op == "dup_line":
            lines = lines[:at + 1] + [lines[at]] + lines[at + 1:]
        elif op == "drop_line":
            lines = lines[:at] + lines[at + 1:]
    return lines


BASES = {
    # the official tools' path (an MLPerf benchmark) and the generic one (mini_lora)
    "llama2_70b_lora": (lf.run_text(seed=7, minutes=21.5).splitlines(keepends=True), rules_for("llama2_70b_lora")),
    "mini_lora": ((MINI_REFERENCE / "result_0.txt").read_text().splitlines(keepends=True),
                  MINI),
}


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(BASES)),
       ops=st.lists(st.tuples(st.sampled_from(OPS), st.floats(0, 1, allow_nan=False)), min_size=1, max_size=3))
def test_a_run_that_was_not_scored_is_neither_counted_nor_converged(tmp_path, base, ops):
    lines, rules = BASES[base]
    path = tmp_path / "result_0.txt"
    path.write_text("".join(corrupt(list(lines), ops)))
    run = scoring.score_run(path, rules)
    good = [scoring.score_run(lf.write_run(tmp_path / f"g{i}.txt", seed=i, minutes=20 + i), rules,
                              run_compliance=False) for i in range(2)] if base == "llama2_70b_lora" else []
    score = scoring.score_runs([], rules, runs=[run, *good])
    for record in [run, *score["runs"]]:
        if any("not scored" in r for r in record["reasons"]):
            assert record["counted"] is False and record["converged"] is False, (ops, record["reasons"])
