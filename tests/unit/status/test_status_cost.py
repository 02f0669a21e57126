"""`mlrepro status` and `mlrepro nodes` on the cost, the early stop and the bad nodes (issue 24)."""

from __future__ import annotations

import argparse
import json

from mlrepro import status
from mlrepro.launch import job as launch
from mlrepro.slurm import node_health


def test_status_adds_up_the_attempts_and_names_the_excluded_nodes(tmp_path, capsys):
    bench = tmp_path / "results" / "b"
    for seed, states in ((1, [("NODE_FAIL", 600), ("COMPLETED", 1800)]), (2, [("COMPLETED", 1200)])):
        for k, (state, elapsed) in enumerate(states, 1):
            (bench / f"seed_{seed}" / f"attempt_{k}").mkdir(parents=True)
            launch.record_attempt(bench / f"seed_{seed}" / f"attempt_{k}", k, "slurm", nodes=2, gpus_per_node=4,
                                  start=None, elapsed_s=elapsed, state=state, device="cuda")
    node_health.record(node_health.bad_nodes_file(tmp_path, "clus"), "gpu07", "Slurm job ended NODE_FAIL",
                       benchmark="b", seed=1, attempt=1, now="2026-11-26T22:00:00+00:00")
    (bench / "early_stop.json").write_text(json.dumps({"message": "stopped after 3 of 10 seeds: ..."}))
    extra = status.reproduction(bench)
    assert extra["cost"]["gpu_hours"] == 2 * 4 * (600 + 1800 + 1200) / 3600 and extra["cost"]["unit"] == "GPU-hours"
    lines = status.reproduction_lines(extra)
    assert lines[0] == "spent: 8 GPU-hours over 3 attempts (1 failed: 1.33 GPU-hours)"
    assert "early stop: stopped after 3 of 10 seeds: ..." in lines
    assert "excluded nodes (clus): gpu07" in lines
    assert any("mlrepro nodes clear gpu07 --system clus" in line for line in lines)
    rc = status.run(argparse.Namespace(benchmark_dir=bench, seeds=None, json=True, no_slurm=True,
                                       status_command="sacct"))
    shown = json.loads(capsys.readouterr().out)
    assert rc == 0 and shown["excluded_nodes"]["clus"]["gpu07"]["seed"] == 1


def test_status_shows_each_seeds_cost_and_the_energy_where_the_gpus_reported_it(tmp_path, capsys):
    bench = tmp_path / "results" / "b"
    for seed, energy in ((1, 8198.0), (2, 10526.0)):  # joules, as NVML's counters gave two seeds on 2 GPUs
        (bench / f"seed_{seed}" / "attempt_1").mkdir(parents=True)
        launch.record_attempt(bench / f"seed_{seed}" / "attempt_1", 1, "local", nodes=1, gpus_per_node=2,
                              start=None, elapsed_s=1800, state="COMPLETED", energy_j=energy, device="cuda")
    (bench / "seed_3").mkdir()  # not started: nothing spent, no energy yet
    rc = status.run(argparse.Namespace(benchmark_dir=bench, seeds=None, json=False, no_slurm=True,
                                       status_command="sacct"))
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:4]}
    assert rc == 0 and out.splitlines()[0].split()[:6] == ["SEED", "STATE", "JOB", "ELAPSED", "NODES", "SPENT"]
    assert "1 (0.00228 kWh)" in rows["1"] and "1 (0.00292 kWh)" in rows["2"]
    assert rows["3"].split()[5] == "-"
    assert "spent: 2 GPU-hours, 0.0052 kWh over 2 attempts" in out


def test_nodes_command_lists_and_clears(tmp_path, capsys):
    path = node_health.bad_nodes_file(tmp_path, "clus")
    node_health.record(path, "gpu07", "x")
    args = argparse.Namespace(action="list", node=None, system="clus", all=False, root=str(tmp_path))
    assert node_health.run(args) == 0 and "gpu07" in capsys.readouterr().out
    args.action, args.node = "clear", "gpu09"
    assert node_health.run(args) == 1 and "gpu09 is not recorded" in capsys.readouterr().err
    args.node = "gpu07"
    assert node_health.run(args) == 0 and node_health.excluded(path) == []


def test_a_seed_the_early_stop_did_not_run_is_stopped(tmp_path):
    folder = tmp_path / "results" / "b" / "seed_4"
    folder.mkdir(parents=True)
    (folder / "stopped.json").write_text(json.dumps({"cancelled": False}))
    (folder / "mllog.txt").write_text("")
    row = status.seed_status(4, folder)
    assert row.state == "stopped" and row.reason == "not run by the early stop"
