"""`mlrepro status` shows what a long stage has done: an MLPerf seed's samples against the reference's
and its ETA, a trained seed waiting for its score, and the downloads of the benchmark's stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlrepro import status
from mlrepro.util import progress
from workspace import make_workspace


def mllog(key, value, t_ms, **metadata):
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t_ms, "event_type": "POINT_IN_TIME", "key": key,
                                     "value": value, "metadata": metadata}) + "\n"


def running_seed(ws: Path, seed: int, evals: int) -> Path:
    """A local mini_lora seed at work: job.json (no Slurm id) and its attempt's log, written just now."""
    folder = ws / "results" / "mini_lora" / f"seed_{seed}"
    logdir = folder / "attempt_1"
    logdir.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"attempt": 1, "scheduler": "local", "logdir": str(logdir)}))
    now = int(time.time() * 1000)
    text = mllog("run_start", None, now - 20_000)
    for i in range(1, evals + 1):
        text += mllog("eval_accuracy", 3.0 / i, now - 20_000 + i * 1000, samples_count=160 * i)
    (logdir / "run.log").write_text(text)
    return folder


def reference(ws: Path, samples: list[int]) -> None:
    runs = [{"converged": True, "samples_to_converge": s} for s in samples]
    (ws / "results" / "mini_lora" / "reference.json").write_text(json.dumps({"score": {"runs": runs, "rcp": {}}}))


def test_a_running_mlperf_seed_shows_samples_against_the_reference_and_an_eta(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    running_seed(ws, 3, evals=10)
    reference(ws, [3000, 3200, 3200, 3200, 9000])
    rows = status.benchmark_status(ws / "results" / "mini_lora", [3])
    row = rows[0]
    assert row.state == status.RUNNING  # a local seed has no job id: its fresh log says it runs
    p = row.progress
    assert p["samples"] == 1600 and p["reference_samples"] == 3200 and p["fraction"] == 0.5
    assert p["samples_per_s"] == 160.0 and p["eta_s"] == 10.0
    assert row.reason.startswith("eval 10: 1,600 of ~3,200 samples (50%), eval_accuracy 0.3") and "ETA 0:10" in row.reason


def test_without_reference_json_yet_samples_and_rate_show(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    running_seed(ws, 1, evals=3)
    row = status.benchmark_status(ws / "results" / "mini_lora", [1])[0]
    assert row.state == status.RUNNING and row.progress["eta_s"] is None and "480 samples" in row.reason


def test_a_trained_seed_waiting_for_its_score_is_finishing_not_not_started(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    folder = running_seed(ws, 2, evals=5)
    (folder / "mllog.txt").write_text((folder / "attempt_1" / "run.log").read_text())
    row = status.benchmark_status(ws / "results" / "mini_lora", [2])[0]
    assert row.state == status.FINISHING and row.progress is None


def test_a_seed_whose_log_went_quiet_is_not_called_running(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    folder = running_seed(ws, 4, evals=5)
    old = time.time() - 3600
    os.utime(folder / "attempt_1" / "run.log", (old, old))
    row = status.benchmark_status(ws / "results" / "mini_lora", [4])[0]
    assert row.state == status.NOT_STARTED


def test_downloads_of_the_benchmarks_stages_and_its_corpus_are_shown(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    corpus_logs = ws / "logs" / "corpora" / "mini_corpus"
    for rank, done in ((0, 30_000), (1, 10_000)):
        progress.write_file(corpus_logs / f"download_task_{rank}.progress.json",
                            {"what": f"mini_corpus download, task {rank}", "unit": "B", "done": done, "total": 40_000,
                             "rate": 2000.0, "eta_s": 1.0, "updated": time.time(), "finished": False})
    progress.write_file(ws / "logs" / "mini_lora" / "checkpoint.progress.json",
                        {"what": "mini_lora checkpoint", "unit": "B", "done": 5, "total": 5, "rate": None,
                         "eta_s": 0, "updated": time.time() - 30, "finished": True})
    stages = {s["stage"]: s for s in status.stage_progress(ws / "results" / "mini_gpt")}
    corpus = stages["corpus mini_corpus download"]
    assert (corpus["done"], corpus["total"], corpus["rate"], corpus["parts"]) == (40_000, 80_000, 4000.0, 2)
    assert corpus["live"] and corpus["eta_s"] == 10.0
    assert "mini_lora checkpoint" not in " ".join(stages)  # another benchmark's stage
    lora = {s["stage"]: s for s in status.stage_progress(ws / "results" / "mini_lora")}
    assert lora["mini_lora checkpoint"]["finished"] and not lora["mini_lora checkpoint"]["live"]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    shown = subprocess.run([sys.executable, "-m", "mlrepro", "status", "results/mini_gpt", "--no-slurm"], cwd=ws,
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == ("corpus mini_corpus download: 39.1 KiB of 78.1 KiB (50%), 3.9 KiB/s, "
                                            "ETA 0:10")
    as_json = subprocess.run([sys.executable, "-m", "mlrepro", "status", "results/mini_gpt", "--no-slurm", "--json"],
                             cwd=ws, capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(as_json.stdout)["stages"][0]["eta_s"] == 10.0
