"""`mlrepro plan --trial K` (mlrepro.kinds.plan_trial): the K best layouts run as seed jobs through
the launcher every seed uses, the measured fastest chosen, predicted against measured kept, and
their cost counted in the benchmark's; here on CPU ranks with the Megatron-LM stand-in
(tests/fixtures/megatron_standin) on the local scheduler."""

from __future__ import annotations

import argparse

import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.cli import main
from mlrepro.corpus import blend
from mlrepro.formats import indexed
from mlrepro.kinds import plan_trial
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_plan
from mlrepro.scoring import cost, megatron_log, megatron_score
from workspace import FIXTURES, REPO, make_workspace


def _workspace(dest: Path) -> Path:
    """The workflow with a two-rank CPU system (the 2x H100 figures) and a one-document blend."""
    ws = make_workspace(dest)
    system = (ws / "config/systems/device-h100x2.yaml").read_text()
    (ws / "config/systems/cpu-h100x2.yaml").write_text(
        system.replace("name: device-h100x2", "name: cpu-h100x2").replace("device: cuda", "device: cpu"))
    corpus = ws / "resources" / "corpora" / "mini_corpus"
    prefix = corpus / "preprocessed" / "train_chunk_0_text_document"
    prefix.parent.mkdir(parents=True)
    w = indexed.IndexedWriter(f"{prefix}.bin")
    w.add_document(np.arange(256, dtype=np.uint16) % 97)
    w.finalize(f"{prefix}.idx")
    blend.write_blend([str(prefix)], corpus / "data_prefix.json")
    (corpus / "tokenizer").mkdir()
    (corpus / "tokenizer" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(97)}))
    shutil.copytree(FIXTURES / "megatron_standin", ws / "standin")
    return ws


@pytest.mark.slow
def test_trial_runs_the_top_candidates_as_seed_jobs_and_chooses_the_fastest(tmp_path, capsys, monkeypatch):
    ws = _workspace(tmp_path / "ws")
    # run_and_time.sh starts torchrun: this interpreter's, as an activated environment would have it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    rc = main(["plan", "--benchmark", "gpt_126m", "--gbs", "4", "--system", "cpu-h100x2", "--root", str(ws),
               "--trial", "2", "--trial-iterations", "4", "--megatron", str(ws / "standin")])
    out = capsys.readouterr().out
    assert rc == 0, out
    record = json.loads((paths.trials_dir(ws, "gpt_126m") / "trials.json").read_text())
    rows = record["candidates"]
    assert [r["rank"] for r in rows] == [1, 2] and len({r["tag"] for r in rows}) == 2
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 and r["error_pct"] is not None for r in rows)
    fastest = min(rows, key=lambda r: r["measured_s"])
    assert record["chosen"]["tag"] == fastest["tag"] and f"chosen: {fastest['layout']}" in out
    # each candidate ran as a seed job: its attempt folder and attempt.json, its cost counted
    for r in rows:
        folder = Path(r["folder"])
        assert (folder / "plan.json").is_file() and (folder / "attempt_1" / "attempt.json").is_file()
        assert "torchrun" in (folder / "launch.sh").read_text()
        assert r["gpu_hours"] > 0
    assert record["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows)) and record["unit"] == "CPU-hours"
    spent = cost.benchmark_cost(paths.benchmark_dir(ws, "gpt_126m"), 2)
    assert set(spent["trials"]) == {r["tag"] for r in rows}
    assert spent["gpu_hours"] == pytest.approx(record["gpu_hours"])
    # the measured steps are kept for the system, and the chosen layout can be read back
    kept = json.loads(paths.observed_json(ws, "cpu-h100x2").read_text())["rows"]
    assert {k["source"] for k in kept} == {f"trial gpt_126m/{r['tag']}" for r in rows}
    assert (paths.calibration_json(ws, "cpu-h100x2")).is_file()
    assert plan_trial.read_chosen(ws, "gpt_126m").gbs == 4
    assert record["measured_after"] == 2  # of 4 iterations: Megatron's first interval and the one after it


def test_a_layouts_short_form_reads_back():
    for lay in (Layout(dp=2, mbs=2, ga=1), Layout(tp=2, pp=2, vpp=4, mbs=1, ga=16, sp=True, recompute="full")):
        assert megatron_plan.read_layout(lay.short()) == lay


RECORDED = REPO / "docs/measurements/baseline_probe/h200_workflow/megatron_bf16.log"  # 20 iterations, each logged


def test_a_trial_measures_its_steady_iterations_only(tmp_path):
    """A trial's step leaves out its warm-up: on the recorded H200 log (iterations 1-2 at 2.9 and 1.8 s,
    then 0.63-0.64 s) it is the median of iterations 6-20; a log whose first quarter is all warm-up
    (here slowed fourfold) reads exactly the same, where the median of the intervals after the first
    (megatron_score's steady state, what the trial measured before) moves."""
    steady = sorted(i.iter_ms for i in megatron_log.parse_log(RECORDED).iterations if i.iteration > 5)
    assert plan_trial.warmup(20) == 5
    assert plan_trial.measured_step(RECORDED, 20) == (pytest.approx(steady[7] / 1000), None)
    slow = []
    for line in RECORDED.read_text().splitlines():
        m = re.search(r"iteration +(\d+)/ +20 \|.*elapsed time per iteration \(ms\): ([0-9.]+)", line)
        if m and int(m[1]) <= 5:
            line = line.replace(f"(ms): {m[2]}", f"(ms): {float(m[2]) * 4:.1f}")
        slow.append(line)
    (tmp_path / "slow.log").write_text("\n".join(slow) + "\n")
    measured, _ = plan_trial.measured_step(tmp_path / "slow.log", 20)
    assert measured == pytest.approx(steady[7] / 1000)
    lumped = megatron_score.throughput(megatron_log.parse_log(tmp_path / "slow.log"))["iter_time_s"]
    assert lumped != pytest.approx(measured)
    assert plan_trial.measured_step(RECORDED, 4) == (pytest.approx(0.6355, abs=0.002), None)
    assert plan_trial.measured_step(tmp_path / "none.log", 20) == (None, "no log")


def test_a_trial_candidate_runs_without_evaluation_and_logs_every_iteration(tmp_path):
    ws = _workspace(tmp_path / "ws")
    settings = mlrepro_config.load({"benchmarks": ["gpt_126m"], "system": "cpu-h100x2",
                                    "pretrain": {"megatron": str(ws / "standin")}}, ws)
    plan = plan_trial.benchmark_plan(settings, "gpt_126m", top=10)
    trial = plan_trial.candidates(plan, 1)[0]
    argv = shlex.split(plan_trial.trial_plan(settings, "gpt_126m", trial, 20).seed_dir.joinpath("launch.sh").read_text())
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert (flag("--train-iters"), flag("--log-interval"), flag("--eval-iters")) == ("20", "1", "0")
    assert int(flag("--eval-interval")) > 20
    with pytest.raises(ValueError, match="leaves none after its warm-up"):
        plan_trial.run_trials(settings, "gpt_126m", plan, 1, iterations=2)


def test_a_trial_runs_its_candidates_with_the_workflows_pretrain_settings(tmp_path):
    """`--configfile` (the workflow's config) gives the candidates the seeds' settings: with `attention: sdpa`
    their line has the SDPA layer spec (a GPU trial without it measured Megatron's unfused attention, 0.148 s
    against the seeds' 0.076 s); the layout stays the trial's to choose."""
    ws = _workspace(tmp_path / "ws")
    (ws / "device.yaml").write_text(f"pretrain: {{attention: sdpa, layout: gpt-125m, megatron: {ws / 'standin'}}}\n")
    args = argparse.Namespace(benchmark="gpt_126m", system="cpu-h100x2", root=str(ws), megatron=None,
                              configfile=str(ws / "device.yaml"))
    settings = plan_trial.trial_settings(args)
    assert settings.pretrain_overrides == {"attention": "sdpa", "megatron": str(ws / "standin")}
    trial = plan_trial.candidates(plan_trial.benchmark_plan(settings, "gpt_126m", top=10), 1)[0]
    argv = shlex.split(plan_trial.trial_plan(settings, "gpt_126m", trial, 20).seed_dir.joinpath("launch.sh").read_text())
    assert argv[argv.index("--spec") + 1:argv.index("--spec") + 3] == ["sdpa_spec", "sdpa_layer_spec"]
    (ws / "bad.yaml").write_text("pretrain: {attention: flash9}\n")
    with pytest.raises(mlrepro_config.ConfigError, match="attention"):
        plan_trial.trial_settings(argparse.Namespace(**{**vars(args), "configfile": str(ws / "bad.yaml")}))


def test_trial_needs_a_pretraining_benchmark(capsys):
    assert main(["plan", "--model", "gpt-126m", "--system", "device-h100x2", "--trial", "2"]) == 2
    assert "--trial runs the candidates as seeds of a benchmark" in capsys.readouterr().err


def _trial_record(ws: Path, system: str = "cpu-h100x2", gbs: int = 4) -> None:
    fast, slow = Layout(dp=2, mbs=2, ga=1), Layout(tp=2, mbs=2, ga=2)
    rows = [{"rank": 1, "tag": "a", "layout": slow.short(), "predicted_s": 0.1, "measured_s": 0.3, "memory_gb": 9.0},
            {"rank": 2, "tag": "b", "layout": fast.short(), "predicted_s": 0.2, "measured_s": 0.25, "memory_gb": 8.0}]
    target = paths.trials_json(ws, "gpt_126m")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"system": system, "gbs": gbs, "candidates": rows, "chosen": {"tag": "b"}}))


def test_the_seeds_run_the_trials_choice_only_where_the_benchmark_asks_for_a_trial(tmp_path):
    ws = _workspace(tmp_path / "ws")
    bench_yaml = ws / "config/benchmarks/gpt_126m.yaml"
    overrides = {"gbs": 4, "mbs": 2}
    _trial_record(ws)
    without = megatron_plan.chosen(ws, mlrepro_config.load_benchmark(ws, "gpt_126m"), "cpu-h100x2", overrides)
    assert without.variant.name == "gpt-125m"  # no trial: key: trials.json is not read
    bench_yaml.write_text(bench_yaml.read_text().replace("  layouts:\n", "  trial: {candidates: 2}\n  layouts:\n"))
    bench = mlrepro_config.load_benchmark(ws, "gpt_126m")
    p = megatron_plan.chosen(ws, bench, "cpu-h100x2", overrides)
    assert p.layout == Layout(dp=2, mbs=2, ga=1) and p.step_s == 0.25 and p.memory_gb == 8.0
    assert p.variant.name == "gpt_126m-trial-b" and p.facts.gpus == 2
    assert megatron_plan.chosen(ws, bench, "cpu-h100x2", {**overrides, "layout": "gpt-125m"}).variant.name == "gpt-125m"
    _trial_record(ws, gbs=8)
    with pytest.raises(megatron_plan.Refused, match="a trial on cpu-h100x2 at GBS 8; the seeds run on cpu-h100x2 at "
                                                    "GBS 4: delete .*trials to run the trial again"):
        megatron_plan.chosen(ws, bench, "cpu-h100x2", overrides)
    paths.trials_json(ws, "gpt_126m").unlink()  # not run yet: the dry run says who chooses
    line = megatron_plan.dry_run(ws, bench, "cpu-h100x2", overrides).describe
    assert line.startswith("layout chosen by the trial before the seeds (pretrain: trial: the planner's 2 best "
                           "layouts at GBS 4, 20 iterations each as jobs, the measured fastest)")


@pytest.mark.parametrize("trial, key", [({"candidates": 0}, "candidates"), ({"iterations": 10}, "candidates"),
                                        ({"candidates": 2, "iterations": 3}, "iterations"),
                                        ({"candidates": 2, "runs": 3}, "runs")])
def test_a_bad_trial_key_is_refused_naming_it(tmp_path, trial, key):
    ws = make_workspace(tmp_path / "ws")
    bench_yaml = ws / "config/benchmarks/gpt_126m.yaml"
    bench_yaml.write_text(bench_yaml.read_text().replace("  layouts:\n", f"  trial: {json.dumps(trial)}\n  layouts:\n"))
    with pytest.raises(mlrepro_config.ConfigError, match=rf"(?s)pretrain.*trial.*{key}|{key}.*trial"):
        mlrepro_config.load_benchmark(ws, "gpt_126m")
