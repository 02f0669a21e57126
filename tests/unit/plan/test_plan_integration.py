"""The planner's inputs and outputs beyond itself (issue 13): measured figures from preflight and the
baseline stage in place of the datasheet's, and a generated config marked in the final report, the
benchmark's report and the submission package (whose system description preflight fills)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mlrepro import config as mlrepro_config
from mlrepro.stages import container as stages_container
from mlrepro.stages import report as stages_report
from mlrepro.stages import score as stages_score
from mlrepro.scoring import package
from mlrepro.cli import main
from mlrepro.plan import hardware, search, workloads
from unit.scoring.test_verdict import NYX, git_repository, shifted  # tests/ is on sys.path (pyproject)
from workspace import make_workspace
import workspace

ROOT = workspace.REPO

# The shared record formats (BRIEF: results/preflight/<system>/preflight.json and
# results/baseline/<system>/baseline.json), with the figures DESIGN.md section 8 measured on H100.
PREFLIGHT = {
    "system": "h100-4x2",
    "hosts": [{"host": "node1", "verdict": "pass",
               "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.19,
                         "matmul_bf16_tflops": 680.0, "copy_tbps": 2.98, "verdict": "pass", "why": ""}
                        for i in range(2)],
               "allreduce": [{"bytes": 1 << 20, "busbw_gbps": 36.0}, {"bytes": 1 << 30, "busbw_gbps": 322.0}],
               "topology": {}, "checks": []}],
    "versions": {"driver": "580.95", "cuda": "13.0", "torch": "2.11.0", "nccl": "2.28.3",
                 "transformer_engine": "not applicable"},
    "summary": {"gpu_model": "NVIDIA H100 80GB HBM3", "gpus_per_node": 2, "gpu_memory_gib": 79.19,
                "matmul_bf16_tflops": 680.0, "allreduce_busbw_gbps": 322.0, "verdict": "pass"},
}
BASELINE = {
    "system": "h100-4x2",
    "runs": [{"workload": "gpt", "model": m, "precision": "bf16", "tp": 1, "pp": 1, "dp": 1, "mbs": 4, "gbs": 8,
              "seq": 2048, "iter_time_s": t, "samples_per_s": 8 / t, "tokens_per_s": 8 * 2048 / t,
              "tflops_per_gpu": tf, "mfu": tf / 989, "peak_mem_gib": 20.0, "predicted_mem_gib": 21.0}
             for m, t, tf in (("gpt-124m", 0.05, 415.0), ("gpt-1.3b", 0.35, 478.7))],
}
# 4 nodes x 2 GPUs: no published llama2_70b_lora config has 2 GPUs per node.
SYSTEM = {"name": "h100-4x2", "scheduler": "slurm", "nodes": 4, "gpus_per_node": 2, "partition": "batch",
          "container_runtime": "enroot",
          "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "platform": "H100X2", "gpu_memory_gb": 80,
                       "peak_tflops_bf16": 989, "nvlink_domain_gpus": 2, "nvlink_busbw_gbs": 200,
                       "network_busbw_gbs": 46, "mfu": 0.3}}


def system(**hardware_changes) -> mlrepro_config.System:
    return mlrepro_config.System(name="h100-4x2", scheduler="slurm", nodes=4, gpus_per_node=2,
                                 hardware={**SYSTEM["hardware"], **hardware_changes})


def write_records(results: Path, preflight: dict | None = PREFLIGHT, baseline: dict | None = BASELINE) -> None:
    for stage, record in (("preflight", preflight), ("baseline", baseline)):
        if record is not None:
            path = results / stage / "h100-4x2" / f"{stage}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))


# ---------------------------------------------------------------- measured figures


def test_without_records_the_datasheet_figures_are_used(tmp_path):
    facts = hardware.from_system(system(), tmp_path)
    assert (facts.mfu, facts.nvlink_busbw_gbs, facts.gpu_memory_gb) == (0.3, 200, 80)
    assert all(f["source"].startswith(("datasheet", "config/systems", "default (")) for f in facts.figures())
    # what no measurement gave is named as a default
    defaults = {f["figure"] for f in facts.figures() if f["source"].startswith("default (")}
    assert {"gemm_rates", "allreduce_by_size", "compute_scale", "chunk_overhead_s"} <= defaults


def test_baseline_mfu_and_preflight_busbw_and_memory_replace_the_datasheet(tmp_path):
    write_records(tmp_path / "results")
    facts = hardware.from_system(system(), tmp_path)
    # the largest model measured (GPT-1.3B, the most FLOPs per sample), against the datasheet peak
    assert facts.mfu == pytest.approx(478.7 / 989)
    assert facts.nvlink_busbw_gbs == 322.0 and facts.network_busbw_gbs == 46
    assert facts.gpu_memory_gb == pytest.approx(79.19 * 2 ** 30 / 1e9)  # GiB measured, GB planned
    sources = {f["figure"]: f["source"] for f in facts.figures()}
    assert sources["mfu"].startswith("baseline (gpt-1.3b") and "baseline.json" in sources["mfu"]
    assert sources["nvlink_busbw_gbs"].startswith("preflight") and sources["gpu_memory_gb"].startswith("preflight")
    assert sources["network_busbw_gbs"].startswith("datasheet") and sources["peak_tflops_bf16"].startswith("datasheet")


def test_preflight_matmul_sets_the_mfu_when_no_baseline_ran(tmp_path):
    write_records(tmp_path / "results", baseline=None)
    facts = hardware.from_system(system(), tmp_path)
    # 680 TFLOP/s (the steady-state matmul of a healthy H100) x 0.704 (the share of it a GPT step
    # reached on H100) = 0.484 of 989
    assert facts.mfu == pytest.approx(0.484, abs=1e-3)
    assert "bf16 matmul 680" in {f["figure"]: f["source"] for f in facts.figures()}["mfu"]


def test_cpu_preflight_and_a_broken_record_fall_back_to_the_datasheet(tmp_path):
    cpu = {**PREFLIGHT, "summary": {"gpu_model": "not applicable", "gpus_per_node": 0, "gpu_memory_gib": None,
                                    "matmul_bf16_tflops": None, "allreduce_busbw_gbps": None, "verdict": "warn"},
           "hosts": [{"host": "cpu", "verdict": "warn", "gpus": [], "allreduce": [], "topology": {}, "checks": []}]}
    write_records(tmp_path / "results", preflight=cpu, baseline=None)
    (tmp_path / "results" / "baseline" / "h100-4x2").mkdir(parents=True)
    (tmp_path / "results" / "baseline" / "h100-4x2" / "baseline.json").write_text("{not json")
    facts = hardware.from_system(system(), tmp_path)
    assert (facts.mfu, facts.nvlink_busbw_gbs, facts.gpu_memory_gb) == (0.3, 200, 80)


def test_measured_figures_change_the_plan_and_the_plan_says_so(tmp_path, capsys):
    """Faster compute makes communication weigh more; the CLI's table names each figure's source."""
    (tmp_path / "config" / "systems").mkdir(parents=True)
    (tmp_path / "workflow").symlink_to(ROOT / "workflow")
    (tmp_path / "config" / "systems" / "h100-4x2.yaml").write_text(yaml.safe_dump(SYSTEM))
    write_records(tmp_path / "results")
    work = workloads.gpt("1.3b", 512)
    datasheet = search.plan(work, hardware.load(tmp_path, "h100-4x2", measured=False))
    measured = search.plan(work, hardware.load(tmp_path, "h100-4x2"))
    assert measured.table.iloc[0]["step_s"] < datasheet.table.iloc[0]["step_s"]  # MFU 0.484 > 0.3
    assert main(["plan", "--model", "gpt-1.3b", "--system", "h100-4x2", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "figures the plan rests on" in out and "baseline (gpt-1.3b" in out and "preflight (all-reduce" in out
    assert main(["plan", "--model", "gpt-1.3b", "--system", "h100-4x2", "--root", str(tmp_path), "--json",
                 "--mfu", "0.5"]) == 0
    figures = {f["figure"]: f for f in json.loads(capsys.readouterr().out)["figures"]}
    assert figures["mfu"] == {"figure": "mfu", "value": 0.5, "source": "--mfu"}


def test_preflight_fills_the_system_description():
    desc = package.preflight_description(PREFLIGHT)
    assert desc == {"accelerator_model_name": "NVIDIA H100 80GB HBM3", "accelerators_per_node": "2",
                    "accelerator_memory_capacity": "79.2 GiB",
                    "other_software_stack": "driver 580.95, cuda 13.0, torch 2.11.0, nccl 2.28.3"}
    cpu = {"summary": {"gpu_model": "not applicable", "gpus_per_node": 0, "gpu_memory_gib": None},
           "versions": {"cuda": None, "torch": "2.11.0+cpu", "nccl": "not applicable"}}
    assert package.preflight_description(cpu) == {"other_software_stack": "torch 2.11.0+cpu"}


# ---------------------------------------------------------------- a generated config in the results


@pytest.fixture(scope="module")
def generated_tree(tmp_path_factory):
    """llama2_lora on 4 x 2 H100 (nothing published fits), scored from NVIDIA's published runs,
    reported and packaged by the stages' own code."""
    tmp = tmp_path_factory.mktemp("plan_report")
    url, commit = git_repository(tmp / "training_results")
    ws = make_workspace(tmp / "ws")
    bench_file = ws / "config" / "benchmarks" / "llama2_lora.yaml"
    bench = yaml.safe_load(bench_file.read_text())
    bench["implementation"]["git"].update(url=url, commit=commit)
    bench_file.write_text(yaml.safe_dump(bench))
    (ws / "config" / "systems" / "h100-4x2.yaml").write_text(yaml.safe_dump(SYSTEM))
    write_records(ws / "results")
    settings = mlrepro_config.load({"benchmarks": ["llama2_lora"], "system": "h100-4x2", "submitter": "mlrepro"}, ws)
    out = ws / "results" / "llama2_lora"
    stages_container.implementation(settings, "llama2_lora", ws / "resources" / "llama2_lora" / "implementation.json")
    stages_report.reference(settings, "llama2_lora", out / "reference.json")
    runs, mllogs = [], []
    for i, log in enumerate(sorted(NYX.glob("result_*.txt"), key=lambda p: int(p.stem[7:]))):
        mllog = shifted(log, out / f"seed_{i + 1}" / "mllog.txt", 1.0)
        stages_score.score_seed(settings, "llama2_lora", i + 1, mllog, mllog.parent / "run.json")
        runs.append(mllog.parent / "run.json")
        mllogs.append(mllog)
    (out / "container.json").write_text(json.dumps({"runtime": "enroot", "tag": "t", "image_id": "sha256:0"}))
    stages_score.score(settings, "llama2_lora", runs, mllogs, out / "score.json", reference_file=out / "reference.json",
                 container_file=out / "container.json", verdict_out=out / "verdict.json",
                 distribution=out / "plots" / "distribution.svg", report_html=out / "report.html",
                 plot_dir=out / "plots")
    results = ws / "results"
    stages_report.final_report(settings, [out / "verdict.json"], results / "report.html", results / "summary.csv",
                        results / "summary.json")
    stages_report.submission(settings, "llama2_lora", out / "score.json", mllogs, out / "submission")
    generated = sorted((ws / "resources" / "llama2_lora" / "implementation").rglob("config_H100X2_4x2x*.sh"))
    assert len(generated) == 1
    return ws, generated[0]


def test_report_and_summary_mark_the_generated_config(generated_tree):
    ws, config = generated_tree
    results = ws / "results"
    table = pd.read_csv(results / "summary.csv")
    assert table[["config", "config_generated"]].values.tolist() == [[config.name, True]]
    assert json.loads((results / "summary.json").read_text())[0]["config_generated"] is True
    page = (results / "report.html").read_text()
    row = page[page.index("<tr data-benchmark='llama2_lora'>"):]
    detail = row[row.index("</tr>") + len("</tr>"):]  # the row's config sits on the line under it
    assert detail.startswith("<tr class='detail'>")
    assert f"{config.name} <b class='generated'>generated by mlrepro plan</b>" in detail[:detail.index("</tr>")]
    own = (results / "llama2_lora" / "report.html").read_text()
    assert f"{config.name} (generated by mlrepro plan: no published config fits)" in own


def test_submission_says_generated_and_carries_preflight_figures(generated_tree):
    ws, config = generated_tree
    desc = json.loads((ws / "results" / "llama2_lora" / "submission" / "mlrepro" / "systems" / "h100-4x2.json")
                      .read_text())
    assert desc["sw_notes"] == f"{config.name} generated by mlrepro plan (no published config fits this system)"
    assert desc["accelerator_model_name"] == "NVIDIA H100 80GB HBM3" and desc["accelerators_per_node"] == "2"
    assert desc["accelerator_memory_capacity"] == "79.2 GiB" and "nccl 2.28.3" in desc["other_software_stack"]
    assert desc["number_of_nodes"] == "4"


def test_generated_config_was_planned_with_the_measured_figures(generated_tree):
    ws, config = generated_tree
    text = config.read_text()
    # gpu memory as preflight measured it (85.0 GB = 79.19 GiB), not the datasheet's 80
    assert "GB of 85.03 GB per GPU" in text, text[:600]
    measured = next(line for line in text.splitlines() if line.startswith("# Measured: "))
    assert "mfu 0.484" in measured and "baseline (gpt-1.3b" in measured and "nvlink_busbw_gbs 322 from preflight" in measured


# ---------------------------------------------------------------- the dropout assumption


def test_dropout_is_an_explicit_choice_of_the_memory_model(capsys, monkeypatch):
    """Korthikanti's 34sbh + 5as^2b stores dropout masks; without dropout the same layer keeps
    32sbh + 2as^2b. The planner's default is no dropout, and its Megatron-LM arguments say so."""
    from mlrepro.plan import memory
    from mlrepro.plan.layout import Layout

    def kept(dropout: bool) -> float:
        w = workloads.gpt("1.3b", 8, flash_attention=False, dropout=dropout)
        return memory.layer_activation_bytes(w, Layout(mbs=4))[0]

    m = workloads.gpt("1.3b").model
    sbh, as2b = m.seq * 4 * m.hidden, m.heads * m.seq ** 2 * 4
    assert kept(True) == pytest.approx(34 * sbh + 5 * as2b) and kept(False) == pytest.approx(32 * sbh + 2 * as2b)
    assert "dropout" in memory.layer_activation_bytes.__doc__ and "dropout" in memory.estimate.__doc__
    monkeypatch.chdir(ROOT)
    for flag, zeroed in (([], True), (["--dropout"], False)):
        assert main(["plan", "--model", "gpt-1.3b", "--gpus", "8", "--system", "dgxh100-64x8", "--datasheet",
                     "--json", *flag]) == 0
        args = json.loads(capsys.readouterr().out)["megatron_args"]
        assert ("--hidden-dropout" in args) == zeroed
    assert main(["plan", "--benchmark", "llama2_70b_lora", "--system", "gb200-nvl72", "--dropout"]) == 2
    assert "--dropout applies to --model" in capsys.readouterr().err
