"""Scoring pretraining runs from Megatron-LM/NeMo training logs (no MLLOG).

The Megatron logs under fixtures/megatron/ are recorded: GPT-126M shape through Megatron-LM's
pretrain_gpt.py (pinned commit) on one H100, 300 iterations, torch-SDPA attention spec and
Megatron's unfused attention (device/run_device.sh).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from mlrepro import gpus
from mlrepro.scoring import loss_band, megatron_log, megatron_score
import workspace

FIX = workspace.FIXTURES / "megatron"
SDPA = FIX / "megatron_sdpa.log"
UNFUSED = FIX / "megatron_unfused.log"
REFERENCE = workspace.REPO / "implementations" / "megatron_gpt" / "reference" / "gpt_126m_loss.csv"
H100 = "NVIDIA H100 80GB HBM3"


def _line(log: Path, iteration: int) -> str:
    return next(x for x in log.read_text().splitlines() if f"iteration {iteration:8d}/" in x)


def test_parses_recorded_megatron_log():
    log = megatron_log.parse_log(SDPA)
    assert log.source == "megatron"
    assert [i.iteration for i in log.iterations] == [1] + list(range(10, 301, 10))
    it100 = next(i for i in log.iterations if i.iteration == 100)
    assert (it100.train_iters, it100.consumed_samples, it100.iter_ms, it100.tflops_per_gpu) == (300, 1600, 159.0, 154.3)
    assert it100.lm_loss == pytest.approx(4.509251) and it100.global_batch_size == 16
    assert it100.time == datetime(2026, 11, 23, 19, 31, 14, 459646)
    assert [(v.iteration, v.loss) for v in log.validations][:3] == [(100, 4.414262), (200, 4.011168), (300, 3.698219)]
    assert log.max_allocated_mb == 9170.07 and log.max_reserved_mb == 10106.0
    assert log.start == datetime(2026, 11, 23, 19, 30, 56, 923167)
    assert log.args["seq_length"] == "2048" and log.args["world_size"] == "1"


def test_srun_prefix_and_colours_are_ignored():
    raw = _line(SDPA, 200)
    plain = megatron_log.parse_lines([raw]).iterations[0]
    noisy = megatron_log.parse_lines(["3: \x1b[32m" + raw.lstrip() + "\x1b[0m"]).iterations[0]
    assert noisy == plain and plain.iteration == 200 and plain.tflops_per_gpu == 145.4


def test_nemo_progress_bar_lines():
    # NeMo (Lightning) progress-bar format: name=value pairs, global_step counted from 0.
    lines = [
        "Epoch 0: :  10%|#         | 200/2000 [03:10<28:30, reduced_train_loss=5.123, global_step=199.0, "
        "consumed_samples=51200.0, train_step_timing in s=0.951]",
        "Epoch 0: :  10%|#         | 200/2000 [03:12<28:40, reduced_train_loss=5.123, global_step=199.0, "
        "consumed_samples=51200.0, train_step_timing in s=0.951, val_loss=5.210]",
    ]
    log = megatron_log.parse_lines(lines)
    assert log.source == "nemo"
    assert len(log.iterations) == 1
    it = log.iterations[0]
    assert (it.iteration, it.consumed_samples, it.lm_loss) == (200, 51200.0, 5.123)
    assert it.iter_ms == pytest.approx(951.0)
    assert [(v.iteration, v.loss) for v in log.validations] == [(200, 5.21)]


def test_scores_time_to_target_and_throughput():
    rec = megatron_score.score_training_log(SDPA, target_loss=4.0, gpu=H100)
    assert rec["counted"] and rec["converged"] and rec["status"] == "success"
    # 4.011 at iteration 200 misses 4.0; 3.698 at iteration 300 (stamped 19:31:48.487040) meets it
    assert rec["iteration_to_converge"] == 300 and rec["samples_to_converge"] == 4800
    expected = (datetime(2026, 11, 23, 19, 31, 48, 487040) - datetime(2026, 11, 23, 19, 30, 56, 923167)).total_seconds()
    assert rec["minutes"] == pytest.approx(expected / 60)
    t = rec["throughput"]
    assert 150 < t["tflops_per_gpu"] < 165 and t["tflops_source"] == "logged"
    assert t["mfu"] == pytest.approx(t["tflops_per_gpu"] / 989)
    assert t["tokens_per_s"] == pytest.approx(16 * 2048 / t["iter_time_s"])
    assert t["peak_mem_gib"] == pytest.approx(10106.0 / 1024)
    # same keys as the MLLOG run record, so the olympic mean, status and report apply
    for key in ("minutes", "status", "converged", "target_reached", "samples_to_converge", "global_batch_size",
                "evals", "compliance", "counted", "reasons", "problems"):
        assert key in rec


def test_sdpa_is_faster_than_unfused_on_the_recorded_runs():
    fast = megatron_score.score_training_log(SDPA, target_loss=4.0, gpu=H100)["throughput"]
    slow = megatron_score.score_training_log(UNFUSED, target_loss=4.0, gpu=H100)["throughput"]
    assert fast["tokens_per_s"] > 2 * slow["tokens_per_s"]
    assert fast["peak_mem_gib"] < slow["peak_mem_gib"]


def test_target_not_reached_and_truncated_log(tmp_path):
    rec = megatron_score.score_training_log(SDPA, target_loss=3.0, gpu=H100)
    assert not rec["converged"] and not rec["counted"] and rec["minutes"] is None
    assert any("<= 3 not reached (best 3.68" in r for r in rec["reasons"])
    lines = SDPA.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[: lines.index(_line(SDPA, 150) + "\n") + 1]))
    rec = megatron_score.score_training_log(cut, target_loss=4.5, gpu=H100)
    assert rec["status"] == "aborted" and rec["target_reached"] and not rec["converged"]
    assert "training stopped at iteration 150 of 300" in rec["reasons"]


def test_model_flops_when_throughput_not_logged(tmp_path):
    stripped = tmp_path / "no_tflops.log"
    text = SDPA.read_text()
    stripped.write_text(re.sub(r" throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|", "", text))
    rec = megatron_score.score_training_log(stripped, target_loss=4.0, gpu=H100, model_flops_per_iter=2.826e13)
    t = rec["throughput"]
    assert t["tflops_source"] == "model"
    assert t["tflops_per_gpu"] == pytest.approx(2.826e13 / t["iter_time_s"] / 1e12)


def test_unknown_gpu_and_empty_log(tmp_path):
    rec = megatron_score.score_training_log(SDPA, target_loss=4.0, gpu="Mystery GPU")
    assert rec["throughput"]["mfu"] is None and any("Mystery GPU" in r for r in rec["reasons"])
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    rec = megatron_score.score_training_log(empty, target_loss=4.0)
    assert rec["status"] is None and not rec["counted"]
    assert "no Megatron-LM or NeMo training lines in the log" in rec["reasons"]


def test_datasheet_peaks():
    assert gpus.datasheet_peak_tflops("NVIDIA H200") == 989
    assert gpus.datasheet_peak_tflops(H100) == 989
    assert gpus.datasheet_peak_tflops("NVIDIA GB200") == 2500  # not B200's 2250
    with pytest.raises(KeyError):
        gpus.datasheet_peak_tflops("Radeon")


def test_loss_band_inside_and_flagged_step(tmp_path):
    rec = megatron_score.score_training_log(SDPA, target_loss=4.0, gpu=H100)
    megatron_score.check_reference(rec, REFERENCE, plot_to=tmp_path / "ok.png")
    assert rec["loss_band"]["inside"] and "flags" not in rec
    bad = dict(rec, curve=[[i, v * (1.2 if i >= 150 else 1.0)] for i, v in rec["curve"]])
    megatron_score.check_reference(bad, REFERENCE, plot_to=tmp_path / "bad.png")
    assert not bad["loss_band"]["inside"] and bad["loss_band"]["first_step"] == 150
    assert "leaves the reference band at step 150" in bad["flags"][0]
    assert (tmp_path / "bad.png").read_bytes()[:4] == b"\x89PNG"


def test_reference_needs_band(tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text("iteration,loss\n10,9.0\n20,8.0\n")
    with pytest.raises(loss_band.ReferenceError, match="no lower,upper columns"):
        loss_band.load_reference(ref)
    band = loss_band.load_reference(ref, tolerance=0.1)
    assert loss_band.check([[15, 8.5]], band).inside
    assert loss_band.check([[15, 9.5]], band).first_step == 15
    ref.write_text("step,value\n1,2\n")
    with pytest.raises(loss_band.ReferenceError, match="iteration,loss"):
        loss_band.load_reference(ref)


def test_cli_writes_run_record(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = megatron_score.main([str(SDPA), "--target-loss", "4.0", "--gpu", H100, "--reference", str(REFERENCE),
                              "--out", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["converged"] and rec["loss_band"]["inside"]
    assert "TFLOP/s/GPU, MFU 16." in capsys.readouterr().out


def test_band_flag_reaches_the_report():
    from mlrepro.scoring import report
    from mlrepro.scoring import score as scoring
    from mlrepro.scoring.rules import rules_for

    rec = megatron_score.score_training_log(SDPA, target_loss=4.0, gpu=H100)
    bad = dict(rec, curve=[[i, v * (1.2 if i >= 150 else 1.0)] for i, v in rec["curve"]])
    megatron_score.check_reference(bad, REFERENCE)
    rules = rules_for("gpt_126m", required_runs=1, target={"metric": "val_loss", "value": 4.0,
                                                                   "direction": "below"})
    score = scoring.score_runs([], rules, runs=[bad], run_compliance=False)
    html = report.render_report(score, logs=[])
    assert "FLAG: loss leaves the reference band at step 150" in html


def test_mlrepro_score_takes_megatron_logs(tmp_path, capsys):
    from mlrepro import cli

    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(SDPA, runs / "seed_1.log")
    (runs / "notes.txt").write_text("iteration counts are in the log\n")  # neither MLLOG nor a training log
    out = tmp_path / "score.json"
    rc = cli.main(["score", str(runs), "--benchmark", "gpt_126m", "--target", "val_loss<=4.0",
                   "--required-runs", "1", "--json", str(out)])
    score = json.loads(out.read_text())
    assert rc == 0 and score["valid"], capsys.readouterr().out
    assert [Path(r["file"]).name for r in score["runs"]] == ["seed_1.log"]
    assert score["score_minutes"] == pytest.approx(score["runs"][0]["minutes"])
    assert score["runs"][0]["throughput"]["tokens_per_s"] > 0
