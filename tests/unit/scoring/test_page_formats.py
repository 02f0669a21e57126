"""Numbers formatted to what they mean, and a miniature's compliance not shown as a failure."""

from __future__ import annotations

import math

import pytest

from mlrepro.scoring import page as present


@pytest.mark.parametrize("p, text", [(0.000769, "< 0.001"), (0.000183, "< 0.001"), (0.0042, "0.004"),
                                     (0.018, "0.02"), (0.3237, "0.32"), (1, "1.00"), (None, "-"),
                                     (math.nan, "-")])
def test_p_values(p, text):
    assert present.p_value(p) == text


def test_differs_at_five_percent():
    assert present.differs(0.049) is True and present.differs(0.05) is False and present.differs(None) is None


@pytest.mark.parametrize("m, text", [(11.275, "11.275"), (1.676, "1.676"), (0.21216, "0.212 (13 s)"),
                                     (None, "-")])
def test_minutes(m, text):
    assert present.minutes(m) == text


def test_percent_factor_samples():
    assert present.percent(12.345) == "+12.3%" and present.percent(-3.04) == "-3.0%"
    assert present.factor(1.0) == "1" and present.factor(1.02346) == "1.0235"
    assert present.samples(9400.0) == "9,400"


def test_a_miniature_has_no_ruleset_rather_than_a_failed_check():
    mini = {"ruleset": None, "mlperf_benchmark": None}
    assert present.compliance({"compliance": {"checked": False}}, mini) == ("no ruleset (miniature)", "na")
    mlperf = {"ruleset": "5.0.0", "mlperf_benchmark": "llama2_70b_lora"}
    assert present.compliance({"compliance": {"checked": False}}, mlperf) == ("not run", "warn")
    assert present.compliance({"compliance": {"checked": True, "pass": True}}, mlperf) == ("pass", "ok")
    assert present.compliance({"compliance": {"checked": True, "pass": False}}, mlperf) == ("FAIL", "bad")


def test_the_metric_is_named_with_what_it_measures():
    lora = {"metric": "eval_accuracy", "value": 0.925, "direction": "below"}
    assert present.metric(lora, "llama2_70b_lora") == "eval_accuracy: evaluation loss (lower is better)"
    assert present.metric({**lora, "measures": "evaluation loss"}) == "eval_accuracy: evaluation loss (lower is better)"
    assert present.metric({"metric": "eval_accuracy", "direction": "below"}, "llama31_405b") == \
        "eval_accuracy: log perplexity (lower is better)"
    assert present.metric({"metric": "accuracy", "direction": "above"}) == "accuracy: higher is better"
    assert present.target_text(lora) == "eval_accuracy ≤ 0.925"
