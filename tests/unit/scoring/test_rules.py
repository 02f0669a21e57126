"""Benchmark rules come from the installed mlperf-logging's own files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mlrepro.scoring import rules
from mlrepro.scoring.rules import DEFAULT_RULESET, MLPERF_TARGETS, rules_for


def _cc_root() -> Path:
    import mlperf_logging.compliance_checker as cc

    return Path(cc.__file__).parent


def test_every_training_ruleset_folder_of_mlperf_logging_is_a_ruleset():
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    folders = {p.name[len("training_"):] for p in _cc_root().glob("training_*.*.*") if p.is_dir()}
    listed = set(rules.rulesets())
    assert {"4.1.0", "5.0.0", "5.1.0"} <= listed
    # only variants such as 0.7.0_warn are left out
    assert all(not re.fullmatch(r"\d+\.\d+\.\d+", rs) for rs in folders - listed)
    for rs in listed:
        assert rules.benchmarks(rs) == tuple(dict.fromkeys(get_allowed_benchmarks("training", rs)))


def test_v5_rules():
    got = {b: rules.benchmark_rules(b, "5.0.0") for b in rules.benchmarks("5.0.0")}
    assert set(got) == {"bert", "dlrm_dcnv2", "retinanet", "stable_diffusion", "llama2_70b_lora", "rgat",
                        "llama31_405b"}
    lora = got["llama2_70b_lora"]
    assert (lora.target.metric, lora.target.direction, lora.target.value) == ("eval_accuracy", "<=", 0.925)
    assert (lora.required_runs, lora.max_dropped_runs, lora.rcp_available) == (10, 1, True)
    assert got["llama31_405b"].required_runs == 3 and got["retinanet"].required_runs == 5
    assert (got["bert"].target.direction, got["bert"].target.value) == (">=", 0.72)
    sd = got["stable_diffusion"].target
    assert sd.metric == "aggregated_eval_accuracy" and sd.direction is None
    assert {(t.field, t.op, t.value) for t in sd.thresholds} == {("FID", "<=", 90.0), ("CLIP", ">=", 0.15)}
    assert all(r.rcp_available for r in got.values())


def test_special_cases_of_the_summarizer():
    assert rules.benchmark_rules("unet3d", "3.0.0").max_dropped_runs == 4
    assert rules.benchmark_rules("unet3d", "3.0.0").required_runs == 40
    assert any("46080" in n for n in rules.benchmark_rules("llama31_405b", "5.0.0").notes)


@pytest.mark.parametrize("ruleset", rules.rulesets())
def test_parsed_targets_agree_with_the_official_check(ruleset):
    """Each parsed threshold, put into the yaml's own expression, passes on its side and fails on the other."""
    for b in rules.benchmarks(ruleset):
        r = rules.benchmark_rules(b, ruleset)
        if not (_cc_root() / f"training_{ruleset}" / f"closed_{b}.yaml").is_file():
            assert r.target is None
            continue
        t = r.target
        assert t is not None and t.thresholds, (ruleset, b)
        scalar = [th for th in t.thresholds if th.field is None and th.value is not None]
        if len(t.thresholds) != 1 or not scalar or "s[" in t.check:
            continue  # dict values and log-dependent targets: checked by the tree test on real logs
        th = scalar[0]
        eps = 1e-6 * max(1.0, abs(th.value))
        good, bad = (th.value - eps, th.value + eps) if th.op in ("<=", "<") else (th.value + eps, th.value - eps)
        state = {"s": {"global_batch_size": 1}, "math": __import__("math")}
        assert eval(t.check, state, {"v": {"value": good}}), (ruleset, b, t.check)
        assert not eval(t.check, state, {"v": {"value": bad}}), (ruleset, b, t.check)


def test_target_is_the_yaml_atleast_one_check():
    r = rules.benchmark_rules("retinanet", "5.0.0")
    data = yaml.safe_load((_cc_root() / "training_5.0.0" / "closed_retinanet.yaml").read_text())
    checks = [k["KEY"]["ATLEAST_ONE_CHECK"] for k in data if "KEY" in k and "ATLEAST_ONE_CHECK" in k["KEY"]]
    assert " ".join(checks[0].split()) == r.target.check


def test_unknown_ruleset_and_benchmark():
    with pytest.raises(rules.UnknownRules, match="no training ruleset '9.9.9'"):
        rules.benchmarks("9.9.9")
    with pytest.raises(rules.UnknownRules, match="not a benchmark of MLPerf training 5.0.0"):
        rules.benchmark_rules("resnet", "5.0.0")


def test_scoring_knows_every_benchmark_of_the_ruleset():
    for b in ("bert", "rgat", "dlrm_dcnv2", "retinanet"):
        r = rules_for(b)
        t = rules.benchmark_rules(b, "5.0.0").target
        assert (r.target_metric, r.target_value, r.target_direction) == (t.metric, t.value, t.direction)
    # A target of two numbers (FID and CLIP) is the compliance checker's to hold runs to: stated, not refused.
    sd = rules_for("stable_diffusion")
    assert sd.target_value is None and "[FID] <= 90" in sd.target["check"] and "[CLIP] >= 0.15" in sd.target["check"]
    assert rules_for("unet3d", ruleset="4.0.0").max_failed_runs == 4
    # The two targets rules.py states itself are the ones mlperf-logging has.
    for b, (metric, value, direction) in MLPERF_TARGETS.items():
        t = rules.benchmark_rules(b, DEFAULT_RULESET).target
        assert (t.metric, t.value, t.direction) == (metric, value, direction)


def test_rules_table_has_a_row_per_ruleset_and_benchmark():
    table = rules.rules_table()
    assert len(table) == sum(len(rules.benchmarks(rs)) for rs in rules.rulesets())
    row = table[(table.ruleset == "5.0.0") & (table.benchmark == "llama31_405b")].iloc[0]
    assert row.required_runs == 3 and row.target == "eval_accuracy <= 5.6" and row.rcp
