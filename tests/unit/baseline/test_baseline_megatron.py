"""Workload (a) of the baseline (issue 12): Megatron-LM GPT runs of the pretraining benchmark, their
settings, the row built from a real Megatron log, the report, and the plan snakemake makes of them."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from mlrepro import config
from mlrepro.baseline import flops, megatron, report
from mlrepro.plan import models
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_launch
from mlrepro.preflight.run import load_settings
from traces_factory import cpu_trace
from workspace import REPO, make_workspace, planned_jobs, run_snakemake

ROOT = REPO
RECORDED = ROOT / "docs" / "measurements" / "megatron_h100"
# Megatron-LM's log of a real run on one H100 (GPT-126M shape, MBS 8 GBS 16, bf16, SDPA; issue 11).
H100_LOG = RECORDED / "workflow_h100" / "seed_1_mllog.txt"
H100 = "NVIDIA H100 80GB HBM3"


def _settings(tmp_path, text: str) -> dict:
    path = tmp_path / "preflight.yaml"
    path.write_text(text)
    return load_settings(ROOT, path)


def test_defaults_are_the_baseline_checklists_model_in_short_synthetic_runs(tmp_path):
    m = _settings(tmp_path, "baseline: {}\n")["baseline"]["megatron"]
    assert m == {"benchmark": "gpt_1p3b", "precisions": ["bf16", "fp16"], "mbs": 4, "gbs": 16, "iterations": 20,
                 "tp": 1, "pp": 1, "dp": None, "attention": "sdpa", "timeout_s": 420, "profile": False}
    assert megatron.model_of(ROOT, m["benchmark"]) == "gpt-1.3b"
    assert load_settings(ROOT)["baseline"]["megatron"]["precisions"] == ["bf16", "fp16"]


@pytest.mark.parametrize("text, key", [
    ("baseline: {megatron: {mbz: 4}}\n", "mbz"),
    ("baseline: {megatron: {precisions: [fp32]}}\n", "precisions"),
    ("baseline: {megatron: {iterations: 2}}\n", "iterations"),
    ("baseline: {megatron: {attention: flash}}\n", "attention"),
])
def test_settings_errors_name_the_file_and_the_key(tmp_path, text, key):
    with pytest.raises(config.ConfigError) as err:
        _settings(tmp_path, text)
    assert "preflight.yaml" in str(err.value) and key in str(err.value) and "megatron" in str(err.value)


def test_layout_is_tp1_pp1_dp_all_gpus_unless_set():
    m = {"tp": 1, "pp": 1, "dp": None, "mbs": 4, "gbs": 128}
    assert megatron.layout_of(m, 8) == Layout(tp=1, pp=1, dp=8, mbs=4, ga=4)
    assert megatron.layout_of({**m, "tp": 4}, 8) == Layout(tp=4, pp=1, dp=2, mbs=4, ga=16)  # the baseline checklist's TP4 DP2
    with pytest.raises(config.ConfigError, match="not a multiple"):
        megatron.layout_of({**m, "gbs": 12}, 8)
    with pytest.raises(config.ConfigError, match="GPU"):
        megatron.layout_of({**m, "tp": 2, "dp": 8}, 8)


def test_launch_line_is_the_seeds_builder_with_mock_data_and_the_precision():
    m = load_settings(ROOT)["baseline"]["megatron"]
    lay = megatron.layout_of(m, 1)
    bf16 = shlex.split(megatron_launch.torchrun_line(megatron.launch_run("gpt-1.3b", lay, m, "bf16")))
    fp16 = shlex.split(megatron_launch.torchrun_line(megatron.launch_run("gpt-1.3b", lay, m, "fp16")))
    assert bf16[:3] == ["torchrun", "--standalone", "--nproc-per-node=1"] and "--mock-data" in bf16
    assert "--bf16" in bf16 and "--fp16" not in bf16 and "--fp16" in fp16 and "--bf16" not in fp16
    for flag, value in (("--num-layers", "24"), ("--hidden-size", "2048"), ("--num-attention-heads", "32"),
                        ("--seq-length", "2048"), ("--micro-batch-size", "4"), ("--global-batch-size", "16"),
                        ("--train-iters", "20"), ("--eval-iters", "0"), ("--log-interval", "1")):
        assert bf16[bf16.index(flag) + 1] == value, flag
    assert "--data-path" not in bf16 and "--transformer-impl" in bf16 and "sdpa_spec" in bf16


def test_row_from_the_recorded_h100_megatron_log():
    lay = Layout(mbs=8, ga=2)
    row = megatron.row_from_log(H100_LOG, model="gpt-126m", precision="bf16", lay=lay, gpu=H100, attention="sdpa")
    shape = dataclasses.replace(models.model("gpt-126m"), vocab=640)  # the run's 554-token BPE, padded by Megatron
    assert row["vocab"] == 640
    assert "error" not in row and row["workload"] == "megatron" and row["iterations"] == 300
    assert row["iter_time_s"] == pytest.approx(0.115)  # median of the logged intervals after the first two
    assert row["samples_per_s"] == pytest.approx(16 / 0.115, rel=1e-3)
    assert row["tflops_per_gpu"] == pytest.approx(flops.megatron(shape, 16) / 0.115 / 1e12, abs=0.1)
    assert row["tflops_logged"] == 178.3  # Megatron's own figure: the same count
    assert row["tflops_per_gpu"] == pytest.approx(row["tflops_logged"], rel=0.01)
    assert row["mfu"] == pytest.approx(row["tflops_per_gpu"] / 989, abs=1e-4)
    assert row["peak_mem_gib"] == pytest.approx(6323.43 / 1024, abs=0.01)  # torch max allocated
    assert row["peak_reserved_gib"] == pytest.approx(6806 / 1024, abs=0.01)
    predicted = megatron.predicted("gpt-126m", lay, "sdpa", vocab=640).total / 2**30
    assert row["predicted_mem_gib"] == pytest.approx(predicted, abs=0.01)
    assert row["mem_error_pct"] == pytest.approx(100 * (predicted - row["peak_mem_gib"]) / row["peak_mem_gib"], abs=0.2)
    assert abs(row["mem_error_pct"]) < 25  # the planner's model of Megatron's recipe, on a real run


def test_profile_traces_iterations_after_the_timed_ones(tmp_path):
    m = {**load_settings(ROOT)["baseline"]["megatron"], "iterations": 10}
    lay = megatron.layout_of(m, 1)
    plain = shlex.split(megatron_launch.torchrun_line(megatron.launch_run("gpt-1.3b", lay, m, "bf16")))
    traced = shlex.split(megatron_launch.torchrun_line(megatron.launch_run("gpt-1.3b", lay, m, "bf16",
                                                                           tmp_path / "run.profile")))
    assert "--profile" not in plain and plain[plain.index("--train-iters") + 1] == "10"
    value = {flag: traced[traced.index(flag) + 1] for flag in ("--train-iters", "--profile-step-start",
                                                                  "--profile-step-end", "--tensorboard-dir")}
    # Megatron records iterations start..end-1 and stops its profiler after iteration `end`: 11 and 12 are
    # traced, 13 is trained so that the trace is written, and 1-10 are the timed ones.
    assert value == {"--train-iters": "13", "--profile-step-start": "11", "--profile-step-end": "13",
                     "--tensorboard-dir": str((tmp_path / "run.profile" / "events").resolve())}
    assert "--use-pytorch-profiler" in traced
    # The traced iterations are slower (the profiler's own work): the row times the ones before them.
    timed = megatron.row_from_log(H100_LOG, model="gpt-126m", precision="bf16", lay=Layout(mbs=8, ga=2), gpu=H100,
                                  attention="sdpa", timed=100)
    whole = megatron.row_from_log(H100_LOG, model="gpt-126m", precision="bf16", lay=Layout(mbs=8, ga=2), gpu=H100,
                                  attention="sdpa")
    assert timed["iterations"] == 100 and whole["iterations"] == 300 and "error" not in timed
    assert timed["intervals"] < whole["intervals"]


def test_a_profiled_run_keeps_its_trace_and_times_only_the_untraced_iterations(tmp_path, monkeypatch):
    """The baseline's own run path (the launch line, run_and_time.sh, torchrun, the row) with the CPU stand-in for
    pretrain_gpt.py, which traces as Megatron-LM's training loop does."""
    # run_and_time.sh starts torchrun: this interpreter's, as an activated environment would have it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    ws = make_workspace(tmp_path / "ws")
    settings = config.load({"benchmarks": ["gpt_126m"], "system": "device-h100"}, ws)
    m = {**load_settings(ROOT)["baseline"]["megatron"], "benchmark": "gpt_126m", "iterations": 6, "mbs": 1,
         "gbs": 2, "profile": True, "timeout_s": 120}
    log_path = tmp_path / "megatron_bf16.tp1pp1dp1mbs1.log"
    row, failed = megatron.one_run(settings, m, "gpt-126m", Layout(mbs=1, ga=2), "bf16", {},
                                   ROOT / "tests" / "fixtures" / "megatron_standin", tmp_path / "launch.sh", log_path)
    assert failed is None, log_path.read_text()[-2000:]
    trace = tmp_path / "megatron_bf16.tp1pp1dp1mbs1.profile" / "torch_profile" / "rank-0.json.gz"
    assert trace.is_file()
    # Iterations 1-6 timed; 7 and 8 traced (Megatron's --profile-step-start 7, --profile-step-end 9); 9 trained so
    # that the profiler stops and writes.
    assert " iteration        9/       9 |" in log_path.read_text()
    assert row["iterations"] == 6 and "error" not in row
    assert row["profile"]["rank0"]["steps"] == [7, 8]
    assert row["profile"]["rank0"]["step_s"] > 0 and row["profile"]["rank0"]["gpu_busy_s"] == 0  # a CPU run


def test_profile_of_reads_each_ranks_trace_and_names_a_bad_one(tmp_path):
    folder = tmp_path / "megatron_bf16.tp1pp1dp2mbs4.profile"
    (folder / "torch_profile").mkdir(parents=True)
    cpu_trace(folder / "torch_profile" / "rank-0.json.gz")
    (folder / "torch_profile" / "rank-1.json.gz").write_bytes(b"not a trace")
    profile = megatron.profile_of(folder)
    assert set(profile) == {"rank0", "rank1"} and profile["rank0"]["step_s"] > 0
    assert "rank-1.json.gz" in profile["rank1"]["error"]
    assert "no profiler trace" in megatron.profile_of(tmp_path / "absent")["error"]


def test_row_of_a_run_that_stopped_early_says_so(tmp_path):
    lines = H100_LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if " iteration       50/" in line)
    log = tmp_path / "megatron_bf16.log"
    log.write_text("\n".join(lines[:cut + 1]) + "\n")
    row = megatron.row_from_log(log, model="gpt-126m", precision="bf16", lay=Layout(mbs=8, ga=2), gpu=H100,
                                attention="sdpa")
    assert row["error"] == "training stopped at iteration 50 of 300" and row["iter_time_s"]
    log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    row = megatron.row_from_log(log, model="gpt-1.3b", precision="bf16", lay=Layout(mbs=4, ga=4), gpu=H100,
                                attention="sdpa")
    assert row["error"].startswith("no training iteration") and "iter_time_s" not in row


def test_not_applicable_without_cuda_or_without_transformer_engine(tmp_path):
    b = load_settings(ROOT)["baseline"]
    cpu = config.load_system(ROOT, "local")
    rows = megatron.not_applicable_rows(ROOT, cpu, b)
    assert [r["precision"] for r in rows] == ["bf16", "fp16"]
    assert all(r["not_applicable"].startswith("not applicable: system local has no CUDA GPUs") for r in rows)
    # A CPU system writes the row and starts nothing, even when its target is asked for directly.
    settings = config.load({"benchmarks": ["mini_lora"], "system": "local"}, ROOT)
    out = tmp_path / "megatron_bf16.json"
    row = megatron.run(settings, b, "bf16", tmp_path / "absent.json", out, tmp_path / "megatron_bf16.log")
    assert json.loads(out.read_text()) == row and "not applicable" in row["not_applicable"]
    gpu = dataclasses.replace(cpu, device="cuda")
    assert megatron.why_not(gpu, "bf16") is None
    if not megatron.has_transformer_engine():
        assert "Transformer Engine" in megatron.why_not(gpu, "fp8")


def test_report_shows_megatron_rows_next_to_the_probe(tmp_path):
    lay = Layout(mbs=8, ga=2)
    measured = megatron.row_from_log(H100_LOG, model="gpt-126m", precision="bf16", lay=lay, gpu=H100,
                                     attention="sdpa")
    skipped = {"workload": "megatron", "model": "gpt-1.3b", "precision": "fp8",
               "not_applicable": "not applicable: fp8 needs Transformer Engine, which this node's Python lacks"}
    # A probe row recorded on the same H100 (tests/fixtures/preflight/h100/baseline.json).
    probe = json.loads((ROOT / "tests" / "fixtures" / "preflight" / "h100" / "baseline.json").read_text())["runs"][0]
    runs = [measured, skipped, probe]
    doc = {"system": "device-h100", "runs": runs, "flops_formula": "Megatron"}
    report.write(doc, tmp_path / "r.md", tmp_path / "r.html", tmp_path / "r.png")
    md = (tmp_path / "r.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| megatron"))
    assert "TP1 PP1 DP1" in row and "gpt-126m" in row and f"{measured['tflops_per_gpu']}" in row
    assert "Not measured" in md and "megatron gpt-1.3b fp8: not applicable" in md
    assert any(line.startswith("| probe") for line in md.splitlines())
    assert "megatron" in (tmp_path / "r.html").read_text() and (tmp_path / "r.png").stat().st_size > 0


def test_report_shows_the_gpus_busy_share_of_traced_rows(tmp_path):
    """The recorded traced rows of one H200 (docs/measurements/planner/h200_profile): GPT-126M's GPU busy a quarter
    of a traced step at MBS 1 and most of it at MBS 8."""
    doc = json.loads((ROOT / "docs/measurements/planner/h200_profile/gpt126m_baseline.json").read_text())
    report.write(doc, tmp_path / "r.md", tmp_path / "r.html", tmp_path / "r.png")
    md = (tmp_path / "r.md").read_text()
    header = next(line for line in md.splitlines() if "GPU Busy (% of a traced step)" in line)
    column = [c.strip() for c in header.split("|")].index("GPU Busy (% of a traced step)")
    busy = {int(cells[[c.strip() for c in header.split("|")].index("MBS")]): float(cells[column])
            for line in md.splitlines() if line.startswith("| megatron")
            for cells in [[c.strip() for c in line.split("|")]]}
    shares = {r["mbs"]: 100 * r["profile"]["rank0"]["gpu_busy_share"] for r in doc["runs"]}
    assert busy == pytest.approx(shares, abs=0.05) and busy[1] < 30 < 60 < busy[8]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("baseline") / "ws")


def test_dry_run_on_a_cuda_system_plans_one_megatron_run_per_precision(ws):
    proc = run_snakemake(ws, "-n", "results/baseline/device-h100/baseline.json", "--config", "system=device-h100",
                         timeout=180)
    out = proc.stdout + proc.stderr
    assert planned_jobs(out) == {"preflight": 1, "baseline_megatron": 2, "baseline": 1}
    assert "results/baseline/device-h100/megatron_bf16.json" in out and "megatron_fp16.json" in out


def test_dry_run_on_the_cpu_system_starts_no_megatron(ws):
    proc = run_snakemake(ws, "-n", "results/baseline/local/baseline.json", timeout=180)
    jobs = planned_jobs(proc.stdout + proc.stderr)
    assert jobs == {"preflight": 1, "baseline": 1}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_recorded_h100_gpt13b_rows_rebuilt_from_their_megatron_logs(precision):
    """docs/measurements/megatron_h100/baseline_h100/: device/baseline_device.sh on one H100; the
    row rebuilt from Megatron's log is the one the workflow wrote, and its FLOP count is Megatron's."""
    recorded = RECORDED / "baseline_h100"
    doc = json.loads((recorded / "baseline.json").read_text())
    written = next(r for r in doc["runs"] if r["workload"] == "megatron" and r["precision"] == precision)
    m = load_settings(ROOT)["baseline"]["megatron"]
    row = megatron.row_from_log(recorded / f"megatron_{precision}.log", model="gpt-1.3b", precision=precision,
                                lay=megatron.layout_of(m, 1), gpu=H100, attention="sdpa")
    for key in ("iter_time_s", "samples_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib", "iterations",
                "skipped_iterations"):
        assert row[key] == written[key], key
    assert row["tflops_per_gpu"] == pytest.approx(row["tflops_logged"], abs=0.1)
    # fp16 keeps Megatron's gradient buffer in 2 bytes (accumulate_allreduce_grads_in_fp32 off, as its
    # log says); predicted with the 4 bytes of bf16's it was 13.9% high (the recorded row)
    assert 0 < row["mem_error_pct"] < 10 and row["iterations"] == 20 and row["intervals"] == 18
    assert [r["workload"] for r in doc["runs"]] == ["megatron", "megatron", "probe"]
    md = (recorded / "baseline_report.md").read_text()
    assert sum(line.startswith("| megatron") for line in md.splitlines()) == 2


def test_recorded_h100_local_attention_row_and_the_fp8_row():
    """The second device call: Megatron's unfused attention (the issue's 147 TFLOP/s) and fp8 without TE."""
    recorded = RECORDED / "baseline_h100_local"
    doc = json.loads((recorded / "baseline.json").read_text())
    local, fp8 = doc["runs"]
    row = megatron.row_from_log(recorded / "megatron_bf16.log", model="gpt-1.3b", precision="bf16",
                                lay=Layout(mbs=4, ga=4), gpu=H100, attention="local")
    assert row["tflops_per_gpu"] == local["tflops_per_gpu"] == pytest.approx(147.4, abs=0.1)
    assert abs(row["mem_error_pct"]) < 5  # scores materialised: workloads.gpt(flash_attention=False)
    assert "Transformer Engine" in fp8["not_applicable"] and "iter_time_s" not in fp8


def test_a_failed_megatron_run_leaves_no_row_for_a_rerun_to_trust(tmp_path, monkeypatch):
    """Megatron-LM exits non-zero (here a stand-in pretrain_gpt.py that fails at start): the job
    raises with the log's path and writes no megatron_<precision>.json, so a rerun runs it again."""
    ws = make_workspace(tmp_path / "ws")
    broken = tmp_path / "megatron"
    broken.mkdir()
    (broken / "pretrain_gpt.py").write_text("import sys\nprint('stand-in: CUDA error: no kernel image')\nsys.exit(3)\n")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # the venv's torchrun
    settings = config.load({"benchmarks": ["mini_lora"], "system": "local", "pretrain": {"megatron": str(broken)}}, ws)
    gpu_system = dataclasses.replace(settings.system, device="cuda", gpus_per_node=1)
    settings = dataclasses.replace(settings, system=gpu_system)
    pre = tmp_path / "preflight.json"
    pre.write_text(json.dumps({"summary": {"verdict": "pass", "gpu_model": H100}}))
    out, log = tmp_path / "megatron_bf16.json", tmp_path / "megatron_bf16.log"
    with pytest.raises(RuntimeError, match=r"baseline run \(bf16\) failed.*megatron_bf16\.log"):
        megatron.run(settings, load_settings(ws)["baseline"], "bf16", pre, out, log)
    assert not out.exists()
    assert "stand-in: CUDA error" in log.read_text()
