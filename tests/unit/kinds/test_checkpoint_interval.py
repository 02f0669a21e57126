"""Issue 33: every benchmark that saves gets its checkpoint interval from the failure model, priced with the
restart and checkpoint costs its own seeds measured (records cut from a real run with failures injected,
tests/fixtures/goodput/) once there are some; the dry run says which figures are measured and which
configured, the trainer is given the interval, and `mlrepro status` and the report show it beside the
measured one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from injected import injected_attempts
from mlrepro import config as mlrepro_config
from mlrepro import paths, status
from mlrepro.kinds import megatron, megatron_deepspeed, mlperf
from mlrepro.launch import job
from mlrepro.plan import goodput as plan_goodput
from mlrepro.pretrain import megatron_plan
from mlrepro.scoring import early_stop, goodput
from mlrepro.scoring import rules as scoring_rules

ROOT = Path(__file__).resolve().parents[3]
# A node failing every 300 s: Young/Daly's interval is then shorter than mini_gpt's run (the default rate's is
# months long, and the implementation's own interval stays: see the last test).
FLAKY = {"node_failures_per_1000_node_days": 1000 * 86400 / 300}


def _workspace(tmp: Path, mini_gpt: dict | None = None) -> Path:
    """The repository's config (copied, to be changed) with its workflow and implementations; a system
    `flaky`: `local` with FLAKY failures."""
    tmp.mkdir(parents=True, exist_ok=True)
    for sub in ("workflow", "implementations"):
        (tmp / sub).symlink_to(ROOT / sub)
    shutil.copytree(ROOT / "config", tmp / "config")
    local = yaml.safe_load((tmp / "config/systems/local.yaml").read_text())
    (tmp / "config/systems/flaky.yaml").write_text(yaml.safe_dump({**local, "name": "flaky", "failures": FLAKY}))
    if mini_gpt is not None:
        path = tmp / "config/benchmarks/mini_gpt.yaml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **mini_gpt}))
    return tmp


def _settings(ws: Path, system: str = "flaky", benchmark: str = "mini_gpt") -> mlrepro_config.Settings:
    return mlrepro_config.load({"benchmarks": [benchmark], "system": system}, ws)


def _young_daly_steps(settings, *, restart_s: float, checkpoint_s: float | None, pace: float, steps: int) -> int:
    model = plan_goodput.FailureModel.of(settings.system.failures).with_measured(restart_s, checkpoint_s)
    run = model.job(nodes=1, gpus=2, work_s=steps * pace, progress_interval_s=pace)
    return max(1, round(plan_goodput.young_daly_interval(run) / pace))


def test_mini_gpt_is_given_young_dalys_interval_and_its_seeds_measured_costs_change_it(tmp_path):
    ws = _workspace(tmp_path)
    settings = _settings(ws)
    bench = settings.benchmark("mini_gpt")
    # Before any seed: the reference runs' pace and length, the system's configured restart; the
    # miniature's checkpoint size is unknown to the planner, so a save is free until one is measured.
    pace, steps = goodput.run_pace(early_stop.reference_scores(ws, bench, scoring_rules.for_benchmark(bench)))
    assert steps == 120 and 0.1 < pace < 1
    fresh = mlperf.dag_plans(settings, "mini_gpt")[1]
    before = _young_daly_steps(settings, restart_s=600, checkpoint_s=None, pace=pace, steps=steps)
    assert 20 < before < steps  # not the implementation's 20: the plan's
    assert fresh.env["CKPT_EVERY"] == str(before)
    assert fresh.checkpoint_interval == {"steps": before, "seconds": round(before * pace, 3), "chosen_by": "Young/Daly",
                                         "young_daly_steps": before}
    line = fresh.describe().split(" | ")[1]
    print(line)
    assert line.startswith("failures: MTBF 0.1 h on 1 node(s), restart 600 s (configured), a save 0 s (size unknown")
    assert f"checkpoint every {before} steps ({before * pace:.1f} s at {pace:.3g} s a step, the reference runs'; Young/Daly)" in line

    # A seed's records from a real run: its resumed attempts' restart (10.6 s) and its timed saves (0.069 s)
    # replace the configured figures, its pace the reference's; saving that cheaply, it saves more often.
    run = injected_attempts(paths.seed_dir(ws, "mini_gpt", 1))
    g = goodput.seed_goodput(run["segments"], run["attempts"])
    plans = mlperf.dag_plans(settings, "mini_gpt")
    measured = plans[2]
    after = _young_daly_steps(settings, restart_s=g["restart_cost_s"], checkpoint_s=g["checkpoint_cost_s"],
                              pace=g["step_s"], steps=steps)
    assert measured.env["CKPT_EVERY"] == str(after) and 1 < after < before / 2
    line = measured.describe().split(" | ")[1]
    print(line)
    assert "restart 10.6 s (measured), a save 0.069 s (measured)" in line
    assert f"checkpoint every {after} steps ({after * g['step_s']:.1f} s at {g['step_s']:.3g} s a step, measured on the seeds; Young/Daly)" in line

    # What a seed runs with is kept in its plan.json: status shows it beside the measured interval (20: the
    # recorded run's CKPT_EVERY), as the report's section does.
    job.write_plan(plans[1])
    shown = status.reproduction_lines(status.reproduction(paths.benchmark_dir(ws, "mini_gpt")))
    print("\n".join(shown))
    assert f"checkpoint interval 20 steps (12.4 s at 0.620 s a step); planned {after} steps (Young/Daly)" in shown


def test_the_benchmarks_own_interval_wins_and_a_bad_one_is_refused_naming_the_key(tmp_path):
    ws = _workspace(tmp_path / "own", {"env": {"CKPT_EVERY": "13"}})
    plan = mlperf.dag_plans(_settings(ws), "mini_gpt")[1]
    assert plan.env["CKPT_EVERY"] == "13"
    assert plan.checkpoint_interval["chosen_by"] == "config/benchmarks/mini_gpt.yaml's env: CKPT_EVERY"
    assert "checkpoint every 13 steps (" in plan.describe()

    ws = _workspace(tmp_path / "bad", {"env": {"CKPT_EVERY": "often"}})
    with pytest.raises(mlrepro_config.ConfigError, match="env: CKPT_EVERY='often' is not a whole number of steps"):
        mlperf.dag_plans(_settings(ws), "mini_gpt")
    spec = yaml.safe_load((ROOT / "config/benchmarks/mini_gpt.yaml").read_text())
    ws = _workspace(tmp_path / "name", {"segments": {**spec["segments"], "interval_env": "CKPT EVERY"}})
    with pytest.raises(mlrepro_config.ConfigError, match="interval_env"):
        _settings(ws)


def test_the_miniature_as_shipped_keeps_its_own_interval_where_young_daly_spans_the_run(tmp_path):
    """The default rate (6.5 failures per 1,000 node-days) on one node: an MTBF of months against a run of
    a minute. The trainer keeps config_common.sh's CKPT_EVERY (its tests kill and resume around it)."""
    plan = mlperf.dag_plans(_settings(_workspace(tmp_path), "local"), "mini_gpt")[1]
    assert plan.env["CKPT_EVERY"] == "20"  # config_common.sh's, unchanged
    assert plan.checkpoint_interval["young_daly_steps"] == 120  # the whole run
    line = plan.describe().split(" | ")[1]
    assert line.startswith("failures: MTBF 3,692.3 h on 1 node(s), restart 600 s (configured)")
    assert "checkpoint every 20 steps (" in line and "the implementation's CKPT_EVERY: Young/Daly's interval is the whole run)" in line
    # a benchmark that does not save has no failures line and no interval
    plain = mlperf.dag_plans(_settings(_workspace(tmp_path / "lora"), "local", "mini_lora"), "mini_lora")[1]
    assert "failures:" not in plain.describe() and plain.checkpoint_interval is None


@pytest.mark.parametrize("benchmark, kind", [("gpt_13b", megatron), ("gpt_13b_deepspeed", megatron_deepspeed)])
def test_a_megatron_benchmark_that_saves_prices_its_seeds_measured_costs(tmp_path, benchmark, kind):
    """Both Megatron kinds (Megatron-LM's and the Megatron-DeepSpeed fork's) price a chained seed the same way."""
    ws = _workspace(tmp_path)
    path = ws / f"config/benchmarks/{benchmark}.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()),
                                    "segments": {"job_seconds": None, "margin_seconds": 60}}))
    settings = _settings(ws, "dgxh100-64x8", benchmark)
    seed = settings.benchmark(benchmark).seeds[0]
    fresh = kind.dag_plan(settings, benchmark, seed)
    assert "restart 600 s (configured), a save " in fresh.describe() and "(measured)" not in fresh.describe()

    injected_attempts(paths.seed_dir(ws, benchmark, seed))
    measured = kind.dag_plan(settings, benchmark, seed)
    line = next(x for x in measured.describe().split(" | ") if x.startswith("failures:"))
    print(line)
    assert "restart 10.6 s (measured), a save 0.069 s (measured)" in line
    # a save of 0.069 s instead of 2 nodes writing 13B parameters' state at 2 GB/s each: saved far more often
    bench, system = settings.benchmark(benchmark), settings.system
    p = megatron_plan.chosen(ws, bench, system.name)
    f = megatron_plan.failures(p, bench, system, measured=goodput.benchmark_goodput(paths.benchmark_dir(ws, benchmark)))
    assert measured.checkpoint_interval == {"steps": f.interval_iterations, "chosen_by": "Young/Daly",
                                            "seconds": round(f.interval_iterations * p.step_s, 3)}
    assert f.interval_iterations < fresh.checkpoint_interval["steps"] / 5
    assert f"checkpoint every {f.interval_iterations:,} iterations (" in line
