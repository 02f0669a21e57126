"""Preflight: parsers on outputs recorded on real machines, verdicts, the CPU run, the config schema (issue 12)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from mlrepro import config
from mlrepro.preflight import NA, collectives, gpus, quick, report, run, topology, verdict, versions
import workspace

FIX = workspace.FIXTURES / "preflight"
H100 = FIX / "h100"  # recorded on the device machine (nvidia-h100-x1), 2026-11-23
PUBLIC = FIX / "public"  # posted in public issues, each file names its source
REPO = workspace.REPO
cpu_only = pytest.mark.skipif(gpus.collect()[0] is None, reason="this machine has an NVIDIA driver")


def test_topology_single_h100_recorded():
    topo = topology.parse((H100 / "topo-m.txt").read_text())
    assert topo["gpus"] == ["GPU0"]
    assert topo["cpu_affinity"] == {"GPU0": "0-15"} and topo["numa_affinity"] == {"GPU0": "0"}
    assert topology.check_tp(topo, 1)[0]["verdict"] == NA


def test_topology_8x_h100_nvswitch_tp_groups():
    topo = topology.parse((PUBLIC / "topo_8xh100_nv18.txt").read_text())
    assert len(topo["gpus"]) == 8 and topology.link(topo, 3, 7) == "NV18"
    assert topo["numa_affinity"]["GPU3"] == "0" and topo["numa_affinity"]["GPU4"] == "1"
    assert [c["verdict"] for c in topology.check_tp(topo, 4)] == ["pass", "pass"]
    tp8 = topology.check_tp(topo, 8)
    assert tp8[0]["verdict"] == "warn" and "NUMA" in tp8[0]["why"]


def test_topology_pcie_server_tp_group_crosses_slow_link():
    topo = topology.parse((PUBLIC / "topo_8x4090_sys.txt").read_text())
    assert topo["nics"] == ["NIC0", "NIC1"] and topo["matrix"]["GPU6"]["NIC0"] == "PHB"
    check = topology.check_tp(topo, 2)[0]
    assert check["verdict"] == "warn" and "GPU0-GPU1 is SYS" in check["why"]


def test_topology_old_format_without_numa_column():
    topo = topology.parse((PUBLIC / "topo_8gpu_pcie_2015.txt").read_text())
    assert topo["nics"] == ["mlx4_0"]
    assert topology.link(topo, 0, 1) == "PIX" and topology.link(topo, 0, 2) == "PHB"
    assert topo["cpu_affinity"]["GPU4"] == "10-19,30-39" and topo["numa_affinity"]["GPU0"] is None
    assert "PHB" in topology.check_tp(topo, 4)[0]["why"]  # the slowest pair of GPU0-3 is named


def test_topology_rejects_text_without_a_matrix():
    with pytest.raises(ValueError, match="GPU0"):
        topology.parse((H100 / "nvcc.txt").read_text())


def test_nccl_tests_output_parsed_by_its_header():
    rows = collectives.parse_nccl_tests((PUBLIC / "nccl_tests_allreduce_nvls.txt").read_text())
    assert [r["bytes"] for r in rows] == [1024 << i for i in range(6)]
    assert rows[-1] == {"bytes": 32768, "time_us": 7.45, "algbw_gbps": 4.40, "busbw_gbps": 7.70}  # out-of-place


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert collectives.busbw(100.0, 2) == 100.0
    assert collectives.busbw(100.0, 8) == 175.0
    rows = collectives.parse_nccl_tests((PUBLIC / "nccl_tests_allreduce_nvls.txt").read_text())
    # the recorded run was on 8 GPUs: its busbw/algbw ratio is 2*7/8 (to the output's rounding)
    assert collectives.busbw(rows[-1]["algbw_gbps"], 8) == pytest.approx(rows[-1]["busbw_gbps"], abs=0.01)


def test_the_baseline_checklists_sweep():
    sizes = collectives.sweep(8, 128 << 20, 2)
    assert sizes[0] == 8 and sizes[-1] == 128 << 20 and len(sizes) == 25


def test_query_csv_recorded_on_h100():
    (gpu,) = gpus.parse_query_csv((H100 / "query-gpu.csv").read_text())
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["memory_gib"] == pytest.approx(79.65, abs=0.01)
    assert gpu["sm_clock_max_mhz"] == 1980 and gpu["ecc_uncorrected"] == 0


def test_versions_recorded_on_h100():
    assert versions.parse_nvcc((H100 / "nvcc.txt").read_text()) == "13.0"
    smi = versions.parse_smi_header((H100 / "nvidia-smi-q.txt").read_text())
    assert smi["driver"] and smi["driver_cuda"].startswith("13.")


def _recorded_versions() -> dict:
    return json.loads((H100 / "preflight.json").read_text())["versions"]


def test_compatibility_of_the_recorded_h100_stack():
    checks = {c["name"]: c for c in versions.compatibility(_recorded_versions())}
    assert checks["driver_for_cuda"]["verdict"] == "pass"
    assert checks["nvcc_matches_torch"]["verdict"] == "pass"
    assert checks["nccl"]["verdict"] == "pass"
    assert checks["transformer_engine"]["verdict"] == "warn"  # none on the device image


@pytest.mark.parametrize("change, name, words", [
    ({"driver": "470.82.01", "driver_cuda": "11.4"}, "driver_for_cuda", "older than 580.65.06"),
    ({"nvcc": "12.4"}, "nvcc_matches_torch", "major version"),
    ({"torch_cuda": None}, "torch_cuda_build", "CPU build"),
    ({"nccl": None}, "nccl", "no multi-GPU"),
])
def test_compatibility_failures_are_explained(change, name, words):
    checks = {c["name"]: c for c in versions.compatibility({**_recorded_versions(), **change})}
    assert checks[name]["verdict"] == "fail" and words in checks[name]["why"]


def _host(name: str) -> dict:
    return json.loads((H100 / name).read_text())["hosts"][0]


def test_recorded_healthy_h100_passes():
    g = dict(_host("preflight.json")["gpus"][0])
    v, why = verdict.judge_gpu(g, gpus.health(g, set()))
    assert v == "pass", why


def test_recorded_busy_h100_fails_naming_the_gpu():
    host = _host("degraded_preflight.json")
    g = dict(host["gpus"][0])
    v, why = verdict.judge_gpu(g, gpus.health(g, set()))
    assert v == "fail" and "of the measured reference 680" in why and "other processes use this GPU" in why
    host["verdict"] = verdict.host_verdict({**host, "gpus": [{**g, "verdict": v, "why": why}]})
    assert quick.reason(host).startswith(f"preflight failed on {host['host']}: GPU0 (NVIDIA H100 80GB HBM3)")


def test_unknown_gpu_model_warns():
    v, why = verdict.judge_gpu({"name": "Tesla T4", "matmul_bf16_tflops": 50.0}, [])
    assert v == "warn" and "no reference" in why


H200_SWEEP = [{"bytes": 8 << 20, "busbw_gbps": 170.0}, {"bytes": 16 << 20, "busbw_gbps": 0.0}]


@pytest.mark.parametrize("busbw, expected", [(216.0, "pass"), (160.0, "warn"), (100.0, "fail")])
def test_allreduce_against_the_measured_2x_h200_reference(busbw, expected):
    rows = [H200_SWEEP[0], {**H200_SWEEP[1], "busbw_gbps": busbw}]
    check = verdict.judge_allreduce(rows, "NVIDIA H200", 2)
    assert check["verdict"] == expected and "16 MiB" in check["why"]


def test_allreduce_without_measured_reference_uses_70pct_of_nvlink():
    low = verdict.judge_allreduce([{"bytes": 128 << 20, "busbw_gbps": 300.0}], "NVIDIA H100 80GB HBM3", 8)
    assert low["verdict"] == "warn" and "67% of the theoretical 450" in low["why"]
    ok = verdict.judge_allreduce([{"bytes": 128 << 20, "busbw_gbps": 340.0}], "NVIDIA H100 80GB HBM3", 8)
    assert ok["verdict"] == "pass"


@cpu_only
def test_cpu_machine_runs_with_gpu_parts_not_applicable(tmp_path):
    settings = run.load_settings(REPO)
    doc = run.preflight("local", settings, None, tmp_path)
    on_disk = json.loads((tmp_path / "preflight.json").read_text())
    assert on_disk["summary"] == doc["summary"]
    assert doc["summary"]["verdict"] == NA and doc["summary"]["matmul_bf16_tflops"] is None
    (host,) = doc["hosts"]
    assert host["gpus"] == [] and host["allreduce"] == []
    assert {c["verdict"] for c in host["checks"]} == {NA}
    assert any(p.startswith("torch==") for p in doc["versions"]["packages"])
    assert "# Environment checklist: local" in (tmp_path / "env_checklist.md").read_text()
    assert doc["seconds"] < 60


@cpu_only
def test_a_gpu_system_without_a_driver_fails(tmp_path):
    doc = run.preflight("device-h100", run.load_settings(REPO), 1, tmp_path)
    check = next(c for c in doc["hosts"][0]["checks"] if c["name"] == "gpus_visible")
    assert doc["summary"]["verdict"] == "fail" and "1 GPU(s) expected" in check["why"]


@cpu_only
def test_quick_check_on_cpu_passes_and_is_recorded(tmp_path):
    host, why = quick.check(tmp_path)
    assert why is None and json.loads((tmp_path / quick.RECORD).read_text())["verdict"] == host["verdict"]


def test_checklist_renders_the_recorded_h100_record():
    text = report.checklist(json.loads((H100 / "preflight.json").read_text()))
    assert "NVIDIA H100 80GB HBM3" in text and "| GPU0 | X | 0-15 | 0 |" in text


def test_invalid_preflight_config_names_file_and_key(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "workflow" / "schemas", root / "workflow" / "schemas")
    (root / "config").mkdir()
    (root / "config" / "preflight.yaml").write_text("baseline:\n  runs:\n    - {model: gpt-1.3b, precison: bf16}\n")
    with pytest.raises(config.ConfigError, match=r"config/preflight.yaml(.|\n)*precison"):
        run.load_settings(root)


def test_gpu_references_live_in_the_one_hardware_table():
    from mlrepro import gpus

    h100, h200 = gpus.gpu_model("NVIDIA H100 80GB HBM3"), gpus.gpu_model("NVIDIA H200")
    assert (h100.measured_matmul_tflops, h100.measured_copy_tbps) == (680, 2.98)
    assert (h200.measured_matmul_tflops, h200.measured_copy_tbps) == (660, 4.1)
    assert h200.measured_busbw_gbs[2][4096 << 20] == 343
    assert dataclasses.is_dataclass(h100) and gpus.gpu_model("Tesla T4") is None


@pytest.mark.timeout(120)
def test_torch_sweep_runs_two_real_ranks(tmp_path):
    """The torch.distributed fallback end to end with two processes (gloo on CPU; NCCL on GPUs)."""
    res = collectives.torch_sweep(2, [8, 1 << 16], tmp_path, backend="gloo")
    assert res["ranks"] == 2 and [r["bytes"] for r in res["rows"]] == [8, 1 << 16]
    for r in res["rows"]:
        assert r["time_us"] > 0 and r["busbw_gbps"] == pytest.approx(r["algbw_gbps"], abs=1e-3)  # n=2: factor 1


def test_frozen_package_list_names_each_distribution_once(tmp_path, monkeypatch):
    """Two copies of one distribution on sys.path (a carried site folder over the image's): the list
    holds the one imports find, as pip freeze does, not both."""
    from mlrepro.preflight import versions

    for folder, version in (("shadowed", "1.0"), ("first", "2.0")):
        info = tmp_path / folder / f"mlrepro_probe_pkg-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlrepro-probe-pkg\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(tmp_path / folder))
    listed = [p for p in versions.frozen_packages() if p.lower().startswith("mlrepro-probe-pkg==")]
    assert listed == ["mlrepro-probe-pkg==2.0"]
    assert len(versions.frozen_packages()) == len({p.split("==")[0].lower() for p in versions.frozen_packages()})


def test_no_baseline_is_measured_on_a_node_that_failed_its_preflight(tmp_path):
    """The one gate both baseline workloads pass (the probe's rule and each Megatron run)."""
    from mlrepro.preflight.run import healthy_record

    record = tmp_path / "preflight.json"
    record.write_text(json.dumps({"summary": {"verdict": "warn", "gpu_model": "NVIDIA H100 80GB HBM3"}}))
    assert healthy_record(record)["summary"]["gpu_model"] == "NVIDIA H100 80GB HBM3"
    record.write_text(json.dumps({"summary": {"verdict": "fail"}}))
    with pytest.raises(RuntimeError, match=r"preflight failed on this system .*preflight\.json.*bad node"):
        healthy_record(record)
