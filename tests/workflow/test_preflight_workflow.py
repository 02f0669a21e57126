"""preflight and baseline through the real snakemake on this (CPU) machine, and the seed's quick check (issue 12)."""

from __future__ import annotations

import json
import shutil

import pytest

from mlrepro.launch import local as launch
from mlrepro.preflight import quick
from workspace import FIXTURES, make_workspace, run_snakemake

H100 = FIXTURES / "preflight" / "h100"


@pytest.mark.slow
def test_preflight_and_baseline_targets_on_cpu(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    run_snakemake(ws, "--cores", "1", "results/baseline/local/baseline.json", timeout=300)
    pre = json.loads((ws / "results/preflight/local/preflight.json").read_text())
    assert pre["system"] == "local" and pre["summary"]["verdict"] == "not applicable"
    assert (ws / "results/preflight/local/env_checklist.md").is_file() and (ws / "logs/preflight/local.log").is_file()
    base = json.loads((ws / "results/baseline/local/baseline.json").read_text())
    assert "not applicable" in base["why"]
    # Workload (a) is not started on a CPU system: its rows say why (mlrepro.baseline.megatron).
    assert [r["workload"] for r in base["runs"]] == ["megatron", "megatron"]
    assert all("has no CUDA GPUs" in r["not_applicable"] for r in base["runs"])
    assert not list((ws / "results/baseline/local").glob("megatron_*"))
    assert "not applicable" in (ws / "results/baseline/local/baseline_report.md").read_text()


@pytest.mark.slow
def test_invalid_preflight_config_stops_the_dag(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    (ws / "config/preflight.yaml").write_text("compute_seconds: -1\n")
    proc = run_snakemake(ws, "--cores", "1", "-n", "results/preflight/local/preflight.json", check=False, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config/preflight.yaml" in out and "compute_seconds" in out
    assert not (ws / "results").exists()


def test_seed_hook_names_the_failing_gpu_from_its_record(tmp_path):
    """What run_seed_local reads after run_and_time returned PREFLIGHT_EXIT: the node's record."""
    shutil.copy(H100 / "degraded" / "preflight_quick.json", tmp_path / quick.RECORD)
    why = launch.preflight_reason(tmp_path)
    assert why.startswith("preflight failed on ") and "GPU0 (NVIDIA H100 80GB HBM3)" in why
    assert launch.preflight_reason(tmp_path / "none") is None  # exit 126 without a record: not the preflight


def test_seed_hook_passes_a_cpu_node(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    assert launch.preflight_failed(log) is False
    assert json.loads((tmp_path / quick.RECORD).read_text())["verdict"] != "fail"
