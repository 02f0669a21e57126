"""The baseline checklist's Megatron baseline on several GPUs: the layouts of one precision, the planner's
among them, each with the planner's predicted iteration time."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from mlrepro import config
from mlrepro.baseline import megatron, report
from mlrepro.plan import hardware
from mlrepro.plan.layout import Layout
from mlrepro.preflight.run import load_settings
from test_baseline_megatron import H100, RECORDED
from workspace import make_workspace

ROOT = Path(__file__).resolve().parents[3]

CHECKLIST = {"benchmark": "gpt_1p3b", "precisions": ["bf16"], "mbs": 4, "gbs": 16, "iterations": 20, "tp": 1, "pp": 1,
            "dp": None, "attention": "sdpa", "timeout_s": 420,
            "layouts": [{"tp": 1}, {"tp": 2}, {"planner": True}]}


def test_each_layout_takes_the_nodes_remaining_gpus_as_dp():
    got = [megatron.layout_of(e, 2) for e in megatron.entries(CHECKLIST) if not e.get("planner")]
    assert got == [Layout(tp=1, dp=2, mbs=4, ga=2), Layout(tp=2, dp=1, mbs=4, ga=4)]
    assert megatron.entries({**CHECKLIST, "layouts": None}) == [{**CHECKLIST, "layouts": None}]


def test_layouts_the_node_cannot_hold_stop_the_dag_by_name():
    megatron.check_layouts(CHECKLIST, 2)
    with pytest.raises(config.ConfigError, match="TP4 x PP1 x DP0 needs more than the node's 2 GPU"):
        megatron.check_layouts({**CHECKLIST, "layouts": [{"tp": 4}]}, 2)
    with pytest.raises(config.ConfigError, match="planner: true takes no other key"):
        megatron.check_layouts({**CHECKLIST, "layouts": [{"planner": True, "tp": 2}]}, 2)
    with pytest.raises(config.ConfigError, match="pipeline"):
        load_settings(ROOT, write(ROOT, "baseline: {megatron: {layouts: [{tp: 2, pipeline: 2}]}}\n"))


def write(root: Path, text: str) -> Path:
    import tempfile

    f = Path(tempfile.mkdtemp()) / "preflight.yaml"
    f.write_text(text)
    return f


def test_the_planners_layout_and_its_predicted_step_time():
    facts = hardware.load(ROOT, "device-h200x2", measured=False)
    lay = megatron.planner_layout("gpt-1.3b", 16, "sdpa", facts)
    assert lay.gpus == 2 and lay.gbs == 16
    # The planner prices every layout the same way it chose this one: its own is the fastest it knows.
    chosen = megatron.predicted_iter_s("gpt-1.3b", lay, "sdpa", facts)
    for other in (Layout(tp=1, dp=2, mbs=4, ga=2), Layout(tp=2, dp=1, mbs=4, ga=4)):
        assert 0 < chosen <= megatron.predicted_iter_s("gpt-1.3b", other, "sdpa", facts) * 1.01


def test_every_layout_runs_and_is_one_row_of_the_report(tmp_path, monkeypatch):
    """Megatron-LM stands in as a script printing the recorded GPT-1.3B log of one H100 (baseline_h100)."""
    ws = make_workspace(tmp_path / "ws")
    standin = tmp_path / "megatron"
    standin.mkdir()
    (standin / "pretrain_gpt.py").write_text(
        f"print(open({str(RECORDED / 'baseline_h100' / 'megatron_bf16.log')!r}).read())\n")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # the venv's torchrun
    settings = config.load({"benchmarks": ["mini_lora"], "system": "device-h100", "pretrain": {"megatron": str(standin)}}, ws)
    settings = dataclasses.replace(settings, system=dataclasses.replace(settings.system, gpus_per_node=2))
    pre = tmp_path / "preflight.json"
    pre.write_text(json.dumps({"summary": {"verdict": "pass", "gpu_model": H100}}))
    b = load_settings(ws)["baseline"]
    b["megatron"] = {**CHECKLIST, "layouts": [{"tp": 1}, {"tp": 2}]}
    out, log = tmp_path / "megatron_bf16.json", tmp_path / "megatron_bf16.log"
    rows = megatron.run(settings, b, "bf16", pre, out, log)
    assert json.loads(out.read_text()) == rows and [(r["tp"], r["dp"]) for r in rows] == [(1, 2), (2, 1)]
    for r in rows:
        assert Path(r["log"]).name in log.read_text() and Path(r["log"]).is_file()
        assert r["predicted_iter_time_s"] > 0 and r["iter_time_error_pct"] == pytest.approx(
            100 * (r["predicted_iter_time_s"] - r["iter_time_s"]) / r["iter_time_s"], abs=0.1)
    doc = {"system": "device-h100x2", "runs": rows + [{**rows[0], "planner_choice": True, "tp": 1, "pp": 2, "dp": 1, "vpp": 4}]}
    md = report.table(doc)
    assert list(md["Layout"]) == ["TP1 PP1 DP2", "TP2 PP1 DP1", "TP1 PP2 DP1 VPP4 (planner's choice)"]
    assert "Predicted Iteration Time (s)" in md.columns
