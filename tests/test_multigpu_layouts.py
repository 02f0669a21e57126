"""Several GPUs through the workflow (issue 23): the layout a GPT seed runs on a 2- or 4-GPU system."""

from pathlib import Path

import pytest

from mlrepro import config
from mlrepro.pretrain import megatron_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpt_126m():
    return config.load_benchmark(ROOT, "gpt_126m")


@pytest.mark.parametrize("layout, shape", [
    (None, (1, 1, 1)),              # the benchmark's first layout that fits: one GPU of the two
    ("gpt-125m-2xdp", (1, 1, 2)),   # seed 002's "2x DP" row
    ("gpt-125m-2xtp", (2, 1, 1)),
])
def test_the_workflow_names_the_layout_a_seed_runs(gpt_126m, layout, shape):
    lay = megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": layout}).layout
    assert (lay.tp, lay.pp, lay.dp) == shape


def test_a_layout_that_does_not_fit_or_does_not_exist_is_refused_by_name(gpt_126m):
    with pytest.raises(megatron_plan.Refused, match="gpt-125m-4xdp needs 4 GPUs .* device-h200x2 has 2"):
        megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-4xdp"})
    with pytest.raises(megatron_plan.Refused, match="no such layout; it has gpt-125m, gpt-125m-2xdp"):
        megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-8xdp"})
    assert megatron_plan.chosen(ROOT, gpt_126m, "device-h100x4", {"layout": "gpt-125m-4xdp"}).layout.dp == 4


def test_the_dry_run_shows_the_named_layout(gpt_126m, tmp_path):
    plan = megatron_plan.dry_run(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-2xtp", "gbs": 16, "mbs": 8},
                                   corpus_dir=tmp_path)
    assert "layout TP2 PP1 DP1 MBS8 GA2 (GBS 16)" in plan.describe
    assert "--tensor-model-parallel-size 2" in plan.describe and "--nproc-per-node=2" in plan.describe


# Seed 003's Megatron baseline on several GPUs: the layouts of one precision, the planner's among them.

import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from mlrepro.baseline import megatron, report  # noqa: E402
from mlrepro.plan import hardware  # noqa: E402
from mlrepro.plan.layout import Layout  # noqa: E402
from mlrepro.preflight.run import load_settings  # noqa: E402
from test_baseline_megatron import H100, RECORDED  # noqa: E402
from workspace import make_workspace  # noqa: E402

SEED_003 = {"benchmark": "gpt_1p3b", "precisions": ["bf16"], "mbs": 4, "gbs": 16, "iterations": 20, "tp": 1, "pp": 1,
            "dp": None, "attention": "sdpa", "timeout_s": 420,
            "layouts": [{"tp": 1}, {"tp": 2}, {"planner": True}]}


def test_each_layout_takes_the_nodes_remaining_gpus_as_dp():
    got = [megatron.layout_of(e, 2) for e in megatron.entries(SEED_003) if not e.get("planner")]
    assert got == [Layout(tp=1, dp=2, mbs=4, ga=2), Layout(tp=2, dp=1, mbs=4, ga=4)]
    assert megatron.entries({**SEED_003, "layouts": None}) == [{**SEED_003, "layouts": None}]


def test_layouts_the_node_cannot_hold_stop_the_dag_by_name():
    megatron.check_layouts(SEED_003, 2)
    with pytest.raises(config.ConfigError, match="TP4 x PP1 x DP0 needs more than the node's 2 GPU"):
        megatron.check_layouts({**SEED_003, "layouts": [{"tp": 4}]}, 2)
    with pytest.raises(config.ConfigError, match="planner: true takes no other key"):
        megatron.check_layouts({**SEED_003, "layouts": [{"planner": True, "tp": 2}]}, 2)
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
    b["megatron"] = {**SEED_003, "layouts": [{"tp": 1}, {"tp": 2}]}
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
