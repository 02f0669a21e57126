"""GPU-hours planned and spent (issue 24): every attempt counts, failed ones included."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from mlrepro.paths import AttemptPaths
from mlrepro.scoring import cost


def _attempt(seed_dir, k, **record):
    folder = seed_dir / f"attempt_{k}"
    folder.mkdir(parents=True)
    (folder / AttemptPaths.RECORD).write_text(json.dumps(cost.attempt_record(k, **record)))
    return folder


def test_every_attempt_counts_nodes_times_gpus_times_elapsed(tmp_path):
    seed = tmp_path / "results" / "b" / "seed_1"
    _attempt(seed, 1, scheduler="slurm", nodes=2, gpus_per_node=4, start=None, end=None, elapsed_s=900,
             state="NODE_FAIL", job_id="11", node_names=["node1", "node2"], source="sacct")
    _attempt(seed, 2, scheduler="slurm", nodes=2, gpus_per_node=4, start=None, end=None, elapsed_s=1800,
             state="COMPLETED", job_id="12", energy_j=None, source="sacct")
    (seed / "mllog.txt").write_text("")
    attempts = cost.seed_attempts(seed, gpus_per_node=4)
    assert [a["gpu_hours"] for a in attempts] == [2.0, 4.0]
    c = cost.seed_cost(attempts)
    assert c["gpu_hours"] == 6.0 and c["failed_gpu_hours"] == 2.0 and c["failed_attempts"] == 1
    assert c["elapsed_s"] == 2700 and c["energy_kwh"] is None and not c["estimated"]


def test_elapsed_from_start_and_end_and_a_running_attempt_counts_up_to_now(tmp_path):
    seed = tmp_path / "results" / "b" / "seed_2"
    _attempt(seed, 1, scheduler="local", nodes=1, gpus_per_node=2, start="2026-11-26T10:00:00+00:00",
             end="2026-11-26T10:30:00+00:00", elapsed_s=None, state="TIMEOUT")
    _attempt(seed, 2, scheduler="local", nodes=1, gpus_per_node=2, start="2026-11-26T11:00:00+00:00",
             end=None, elapsed_s=None, state="RUNNING")
    now = dt.datetime(2026, 11, 26, 11, 15, tzinfo=dt.timezone.utc)
    a1, a2 = cost.seed_attempts(seed, 2, now=now)
    assert a1["elapsed_s"] == 1800 and a1["gpu_hours"] == 1.0
    assert a2["elapsed_s"] == 900 and a2["gpu_hours"] == 0.5
    assert cost.seed_cost([a1, a2])["failed_gpu_hours"] == 1.0  # the running one is not a failure (yet)


def test_energy_is_summed_only_where_every_attempt_reports_it(tmp_path):
    seed = tmp_path / "seed_1"
    _attempt(seed, 1, scheduler="slurm", nodes=1, gpus_per_node=8, start=None, end=None, elapsed_s=3600,
             state="COMPLETED", energy_j=3.6e6 * 5)
    assert cost.seed_cost(cost.seed_attempts(seed, 8))["energy_kwh"] == pytest.approx(5.0)
    _attempt(seed, 2, scheduler="slurm", nodes=1, gpus_per_node=8, start=None, end=None, elapsed_s=60,
             state="COMPLETED", energy_j=None)
    assert cost.seed_cost(cost.seed_attempts(seed, 8))["energy_kwh"] is None


def test_a_seed_folder_from_before_attempt_json_is_estimated_from_its_files(tmp_path):
    seed = tmp_path / "results" / "b" / "seed_3"
    old = seed / "attempt_1"
    old.mkdir(parents=True)
    (old / "run.log").write_text("x")
    (old / "run.pid").write_text("1")
    os.utime(old / "run.pid", (1_000_000_000, 1_000_000_000))
    os.utime(old / "run.log", (1_000_000_120, 1_000_000_120))
    (seed / "failure.json").write_text(json.dumps({"reason": "r", "state": "TIMEOUT", "attempt": 1}))
    (seed / "job.json").write_text(json.dumps({"scheduler": "local", "attempt": 2, "ranks": 2,
                                               "submitted": "2001-09-09T01:50:00+00:00"}))
    new = seed / "attempt_2"
    new.mkdir()
    (new / "run.log").write_text("y")
    os.utime(new / "run.log", (1_000_000_260, 1_000_000_260))
    (seed / "mllog.txt").write_text("")
    a1, a2 = cost.seed_attempts(seed, gpus_per_node=2)
    assert a1["estimated"] and a1["state"] == "TIMEOUT" and a1["elapsed_s"] == 120
    # from job.json's submitted (1_000_000_200 s) to the log's last write
    assert a2["state"] == "COMPLETED" and a2["elapsed_s"] == 60
    assert cost.seed_cost([a1, a2])["estimated"]


def test_slurm_job_json_of_the_current_attempt_is_read_as_sacct_wrote_it(tmp_path):
    seed = tmp_path / "seed_1"
    (seed / "attempt_1").mkdir(parents=True)
    (seed / "job.json").write_text(json.dumps({"scheduler": "slurm", "job_id": "7", "attempt": 1, "state": "COMPLETED",
                                               "elapsed_s": 720, "nodes": ["node1", "node2"]}))
    (a,) = cost.seed_attempts(seed, gpus_per_node=4)
    assert a["nodes"] == 2 and a["gpu_hours"] == pytest.approx(2 * 4 * 720 / 3600) and not a["estimated"]


def test_benchmark_cost_adds_seeds_and_planned_gives_both_bounds(tmp_path):
    bench = tmp_path / "results" / "b"
    for s, el in ((1, 3600), (2, 1800)):
        _attempt(bench / f"seed_{s}", 1, scheduler="local", nodes=1, gpus_per_node=2, start=None, end=None,
                 elapsed_s=el, state="COMPLETED")
    plan = cost.planned(10, 1, 2, walltime_minutes=15, reference_minutes=[0.2, 0.3, 0.25])
    assert plan["upper_bound_gpu_hours"] == 5.0 and plan["expected_gpu_hours"] == pytest.approx(10 * 2 * 0.25 / 60)
    assert cost.planned(3, 64, 4, 120)["expected_gpu_hours"] is None
    total = cost.benchmark_cost(bench, 2, plan)
    assert total["gpu_hours"] == 3.0 and total["attempts"] == 2 and set(total["seeds"]) == {"1", "2"}
    assert total["planned"] is plan
    assert cost.total([total, total])["gpu_hours"] == 6.0


def test_saving_and_units():
    assert cost.saved_by_stopping([0.02, 0.04], 7) == pytest.approx(0.21)
    assert cost.saved_by_stopping([], 7) is None
    assert cost.unit("cpu") == "CPU-hours" and cost.unit("cuda") == "GPU-hours"
    assert cost.hours(0.01234, "CPU-hours") == "0.0123 CPU-hours" and cost.hours(None) == "-"


def test_energy_is_summed_in_kwh_only_where_every_attempt_reports_it(tmp_path):
    """Issue 24: energy beside the GPU-hours, from sacct's ConsumedEnergyRaw or NVML's counters; a seed with
    one attempt that did not report it has no energy figure (a partial sum would read as the whole)."""
    from mlrepro.preflight import gpus as node_gpus

    reported = [cost.attempt_record(1, "slurm", nodes=1, gpus_per_node=8, start=None, elapsed_s=3600,
                                    state="FAILED", energy_j=1.8e6),
                cost.attempt_record(2, "slurm", nodes=1, gpus_per_node=8, start=None, elapsed_s=3600,
                                    state="COMPLETED", energy_j=5.4e6)]
    for r in reported:
        r["gpu_hours"] = cost.gpu_hours(r)
    assert cost.seed_cost(reported)["energy_kwh"] == pytest.approx(2.0)
    partial = [dict(reported[0], energy_j=None), reported[1]]
    assert cost.seed_cost(partial)["energy_kwh"] is None
    # Two readings of NVML's counters: their difference, or nothing when one is missing or the driver reloaded.
    assert node_gpus.energy_between(1000.0, 1500.5) == pytest.approx(500.5)
    assert node_gpus.energy_between(None, 10.0) is None and node_gpus.energy_between(10.0, 5.0) is None
    # This machine has no NVIDIA driver: no reading, not zero joules.
    assert node_gpus.energy_j(None, 1) is None
