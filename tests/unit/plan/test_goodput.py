"""Failures priced in the plan (issue 33): the failure model of a system, the Young/Daly interval, the closed
form against the seeded simulator, the dry run's line, and the planner's time to train with the losses."""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess

import pytest
import yaml

from mlrepro import config as mlrepro_config
from mlrepro.launch import attempt
from mlrepro.plan import goodput, hardware, search, workloads
from mlrepro.pretrain import megatron_plan
import workspace

ROOT = workspace.REPO
DAY = 86400.0


def big_job(**changes) -> goodput.Job:
    """40 days of GPT training on 2,048 nodes at RSC-1's rate: a failure every 1.8 hours."""
    model = goodput.FailureModel(checkpoint_seconds=60.0)
    job = model.job(nodes=2048, gpus=16384, work_s=40 * DAY, progress_interval_s=10.0)
    return dataclasses.replace(job, **changes)


@pytest.mark.parametrize("changes, minutes", [
    ({}, 10), ({}, 60), ({}, 240),
    ({"job_limit_s": 4 * 3600.0}, 15),  # a chain of 4-hour jobs, saving at each limit
    ({"job_limit_s": 4 * 3600.0, "saves_at_limit": False}, 15),  # ... losing the work since the last save
    ({"saves": False, "work_s": 3 * 3600.0, "failure_rate": 1 / 20000}, None),  # a run that never saves
])
def test_the_closed_form_and_the_simulation_agree(changes, minutes):
    job = big_job(**changes)
    interval = minutes * 60.0 if minutes else None
    closed = goodput.expected(job, interval)
    simulated = goodput.simulate(job, interval, runs=2000, seed=1)
    assert simulated.effective == pytest.approx(closed.effective, abs=0.01)
    assert simulated.interruptions == pytest.approx(closed.interruptions, rel=0.05)
    assert simulated.planned_restarts == pytest.approx(closed.planned_restarts, rel=0.05, abs=0.5)
    assert closed.lost_gpu_hours == pytest.approx(job.gpus * (closed.wall_s - job.work_s) / 3600)


def test_a_run_without_failures_loses_only_its_saves():
    job = big_job(failure_rate=0.0, work_s=10 * 3600.0)
    e = goodput.expected(job, 600.0)
    # 60 intervals of 10 minutes, each saved but the last: 59 saves of a minute
    assert e.interruptions == 0 and e.effective == pytest.approx(36000 / (36000 + 59 * 60))
    assert goodput.simulate(job, 600.0, runs=10).effective == pytest.approx(e.effective)


def test_the_young_daly_interval_is_near_the_simulated_best():
    job = big_job()
    chosen = goodput.young_daly_interval(job)
    # Young's first order: sqrt(2 x 60 s x 1.8 h); Daly's correction shortens it by about the save
    assert chosen == pytest.approx(math.sqrt(2 * 60 * job.mtbf_s) - 60, rel=0.05)
    grid = [m * 60.0 for m in (2, 5, 8, 11, 14, 17, 20, 30, 45, 60)]
    simulated = {tau: goodput.simulate(job, tau, runs=1000, seed=3).effective for tau in grid}
    best = max(simulated.values())
    at_chosen = goodput.simulate(job, chosen, runs=1000, seed=3).effective
    assert at_chosen >= best - 0.003, (chosen / 60, at_chosen, simulated)
    assert at_chosen > simulated[60 * 60.0] + 0.05  # an hour is far from it at this scale


def test_the_system_file_gives_the_failure_model_with_its_defaults():
    system = mlrepro_config.load_system(ROOT, "dgxh100-64x8")
    model = goodput.FailureModel.of(system.failures)
    assert model.node_failures_per_1000_node_days == 6.5  # Kokolis et al. 2024, RSC-1
    assert model.restart_seconds == 600 and model.hang_share == 0.1
    assert hardware.from_system(system).failures == model
    # 64 nodes at 6.5 per 1,000 node-days: one failure every 57.7 hours
    assert model.job(nodes=64, gpus=512, work_s=1.0).mtbf_s / 3600 == pytest.approx(1000 * 24 / (6.5 * 64))


@pytest.mark.parametrize("key, value, message", [
    ("node_failures_per_1000_node_days", -1, "failures.node_failures_per_1000_node_days: -1 is less than the minimum of 0"),
    ("hang_share", 1.5, "failures.hang_share: 1.5 is greater than the maximum of 1"),
    ("restart_minutes", 10, "failures: unknown key 'restart_minutes'"),
])
def test_the_schema_rejects_a_bad_failures_block_naming_the_key(tmp_path, key, value, message):
    (tmp_path / "config" / "systems").mkdir(parents=True)
    (tmp_path / "workflow").symlink_to(ROOT / "workflow")
    data = yaml.safe_load((ROOT / "config" / "systems" / "dgxh100-64x8.yaml").read_text())
    data["failures"] = {key: value}
    (tmp_path / "config" / "systems" / "dgxh100-64x8.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(mlrepro_config.ConfigError, match="dgxh100-64x8.yaml is invalid") as err:
        mlrepro_config.load_system(tmp_path, "dgxh100-64x8")
    assert message in str(err.value)


def test_measured_costs_win_over_the_configured_ones():
    model = goodput.FailureModel.of({"restart_seconds": 900, "checkpoint_write_gbs": 1.0}, "config/systems/x.yaml")
    size = 100e9
    assert model.checkpoint_cost(size, nodes=4) == pytest.approx(25.0)  # 100 GB at 4 x 1 GB/s
    measured = model.with_measured(restart_seconds=95.0, checkpoint_seconds=7.5)
    assert measured.restart_seconds == 95.0 and measured.checkpoint_cost(size, nodes=4) == 7.5
    assert measured.sources == {"restart_seconds": "measured", "checkpoint_write_gbs": "config/systems/x.yaml",
                                "checkpoint_seconds": "measured"}
    assert model.with_measured() == model  # nothing measured yet: the configured figures stay
    capped = dataclasses.replace(model, storage_write_gbs=2.0)
    assert capped.checkpoint_cost(size, nodes=4) == pytest.approx(50.0)  # the file system caps the nodes


def test_the_hang_delay_is_the_hang_watchs_rule():
    rule = attempt.HangRule()
    model = goodput.FailureModel()
    assert (model.hang_multiple, model.hang_floor_seconds) == (rule.multiple, rule.floor_s)
    for quiet in (1.0, 119.0, 500.0):
        assert model.hang_seconds(quiet) == rule.timeout(quiet)
    slow = goodput.FailureModel.of({}, hang={"multiple": 3, "floor_seconds": 60})
    assert slow.hang_seconds(100.0) == 300.0


def test_the_checkpoint_is_weights_and_adam_state():
    w = workloads.gpt("gpt-175b")
    assert goodput.checkpoint_bytes(w) == pytest.approx(w.model.total_params() * 14)
    lora = workloads.LLAMA2_70B_LORA
    assert goodput.checkpoint_bytes(lora) < 1e-3 * lora.model.total_params() * 14  # the adapters only


def test_the_dry_run_prints_the_expected_failures_next_to_the_planned_gpu_hours(tmp_path):
    bench = _saving(tmp_path / "conf", saves=False)
    shown = megatron_plan.dry_run(tmp_path / "conf", bench, "dgxh100-64x8", corpus_dir=tmp_path).describe.split(" | ")
    line = shown[1]
    assert line.startswith("failures: MTBF 1,846.2 h on 2 node(s), restart 600 s (configured), a save ")
    # gpt_13b without its segments: block, so it never saves: a failure restarts it from the beginning. The figures are
    # the plan's own (its step time moves with the cost model), printed as failures() computes them.
    p = megatron_plan.chosen(tmp_path / "conf", bench, "dgxh100-64x8")
    f = megatron_plan.failures(p, bench, mlrepro_config.load_system(tmp_path / "conf", "dgxh100-64x8"))
    assert not f.saves and 0.3 < f.expected.interruptions < 1
    assert (f"no checkpoints (no segments: block): expected {f.expected.interruptions:.3g} interruptions, "
            "each restarting the run") in line
    planned, lost = p.layout.gpus * p.hours, f.expected.lost_gpu_hours
    assert f"would keep {f.if_saved.effective:.1%}" in line and f.if_saved.effective > 0.99
    assert f"; planned {planned:,.0f} GPU-hours, expected lost to failures {lost:,.0f} GPU-hours" in line
    assert 0.15 < lost / planned < 0.35  # about one restart in two of a run 0.53 MTBFs long


def _saving(tmp_path, pretrain: dict | None = None, saves: bool = True):
    """gpt_13b with a segments: block (it saves), or without one, in a copy of the repository's config."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for sub in ("workflow", "implementations"):
        (tmp_path / sub).symlink_to(ROOT / sub)
    shutil.copytree(ROOT / "config", tmp_path / "config")
    path = tmp_path / "config" / "benchmarks" / "gpt_13b.yaml"
    data = yaml.safe_load(path.read_text())
    data["segments"] = {"job_seconds": None, "margin_seconds": 60}
    if not saves:
        del data["segments"]
    data["pretrain"] |= pretrain or {}
    path.write_text(yaml.safe_dump(data))
    return mlrepro_config.load_benchmark(tmp_path, "gpt_13b")


def test_a_saving_benchmark_gets_the_young_daly_interval_in_iterations(tmp_path):
    bench = _saving(tmp_path)
    shown = megatron_plan.dry_run(tmp_path, bench, "dgxh100-64x8", corpus_dir=tmp_path).describe.split(" | ")[1]
    p = megatron_plan.chosen(tmp_path, bench, "dgxh100-64x8")
    f = megatron_plan.failures(p, bench, mlrepro_config.load_system(tmp_path, "dgxh100-64x8"))
    assert f.saves and f.chosen_by == "Young/Daly"
    assert f.interval_iterations == round(goodput.young_daly_interval(f.job) / p.step_s)
    assert f"checkpoint every {f.interval_iterations:,} iterations (" in shown and "min, Young/Daly); expected" in shown
    assert (f"effective training time {f.expected.effective:.1%}; planned {p.layout.gpus * p.hours:,.0f} GPU-hours, "
            "expected lost to failures") in shown and f.expected.effective > 0.99
    # the workflow's config, else the benchmark's own key, wins over the computed interval
    system = mlrepro_config.load_system(tmp_path, "dgxh100-64x8")
    own = _saving(tmp_path / "own", {"save_interval": 500})
    assert megatron_plan.failures(p, own, system).interval_iterations == 500
    assert megatron_plan.failures(p, own, system, {"save_interval": 250}).interval_iterations == 250


def test_the_planners_time_includes_the_expected_failure_losses():
    facts = hardware.load(ROOT, "dgxh100-64x8", measured=False)
    w = workloads.gpt("gpt-175b", 1536)
    times = {}
    for gpus in (512, 4096):
        scaled = facts.with_gpus(gpus)
        priced = search.plan(w, scaled, top=1)
        bare = search.plan(w, dataclasses.replace(scaled, failures=None), top=1)
        assert priced.layout == bare.layout
        times[gpus] = priced.best.objective_s / bare.best.objective_s
    # a GPT step divided by the effective training time, which falls with the nodes
    assert 1.01 < times[512] < times[4096] < 1.2, times
    # a timed benchmark run never saves: a failure starts it over, and the published layout stays chosen
    bench = workloads.LLAMA31_405B
    priced = search.plan(bench, facts, top=1)
    bare = search.plan(bench, dataclasses.replace(facts, failures=None), top=1)
    assert priced.layout == bare.layout
    job = facts.failures.job(nodes=64, gpus=512, work_s=bare.best.objective_s,
                             checkpoint_bytes=goodput.checkpoint_bytes(bench),
                             progress_interval_s=bare.best.objective_s / bare.best.steps, saves=False)
    assert priced.best.objective_s == pytest.approx(goodput.expected(job).wall_s)
    assert priced.best.objective_s > 1.05 * bare.best.objective_s


def test_the_simulator_lands_above_90_percent_on_llama_3(tmp_path):
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "benchmarks" / "goodput_sim.py")],
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sourced = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("as sourced"))
    assert sourced.split()[-1] == "True"


def test_the_prediction_for_a_measured_run_with_injected_failures():
    """measured_prediction: each seed a run of the seeds' mean productive time at the injected MTBF, with the
    costs the seeds measured; the first start-up counts (attempts are timed from their start). Without failures
    only the start-up and the saves are lost; more often failing, less effective; a missing figure: no prediction."""
    measured = {"productive_s": 80.0, "restart_cost_s": 4.0, "checkpoint_cost_s": 0.5,
                "checkpoint_interval_steps": 20, "step_s": 0.25, "seeds": {"1": {}, "2": {}}}
    calm = goodput.measured_prediction(measured, 1e9, runs=200)
    assert calm["effective"] == pytest.approx(40.0 / (40.0 + 4.0 + 7 * 0.5), rel=1e-3)  # 8 saves of 5 s work, 7 written
    often = goodput.measured_prediction(measured, 20.0, runs=4000)
    rare = goodput.measured_prediction(measured, 200.0, runs=4000)
    assert often["effective"] < rare["effective"] < calm["effective"]
    assert 1.5 < often["interruptions_per_seed"] < 4 and rare["interruptions_per_seed"] < 0.5
    assert "MTBF 20 s" in often["method"] and often["spread"] > 0
    assert goodput.measured_prediction({**measured, "restart_cost_s": None}, 20.0) is None
