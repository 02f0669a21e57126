"""`mlrepro status` read while the stages run, as a user watching them would.

1. The corpus download from a slow localhost server (the miniature corpus, paced): status shows
   the bytes, the rate and an ETA while it runs; the stage's log gets a line at a steady interval.
2. A mini_lora seed training: status shows its samples against the reference's and an ETA.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from mlrepro.corpus import served
from workspace import make_workspace, snakemake_cmd

pytestmark = pytest.mark.slow

INTERVAL = 1.0  # MLREPRO_PROGRESS_SECONDS: the stages' 10 s made short enough to watch a short download


def status(ws: Path, benchmark: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlrepro", "status", f"results/{benchmark}", "--no-slurm", "--json"],
                          cwd=ws, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def status_text(ws: Path, benchmark: str) -> str:
    return subprocess.run([sys.executable, "-m", "mlrepro", "status", f"results/{benchmark}", "--no-slurm"],
                          cwd=ws, capture_output=True, text=True, timeout=120).stdout


def watch(ws: Path, run: subprocess.Popen, found, seconds: float, what: str):
    """Poll status until found(status) gives something, while the workflow still runs."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if run.poll() is not None:
            out = run.stdout.read() if run.stdout else ""
            raise AssertionError(f"the workflow ended (rc {run.returncode}) before status showed {what}:\n{out[-4000:]}")
        got = found(ws)
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"status never showed {what} in {seconds:.0f} s")


def start(ws: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(snakemake_cmd("--profile", "profiles/local", *args), cwd=ws, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "MLREPRO_PROGRESS_SECONDS": str(INTERVAL),
                                 **(env or {})})


def test_status_shows_a_corpus_download_with_rate_and_eta(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    origin = served.origin(tmp_path / "origin", "mini_corpus")
    server = served.serve(origin, bytes_per_second=2000)  # a slow link: each ~17 KB shard takes seconds
    try:
        path = ws / "config" / "corpora" / "mini_corpus.yaml"
        corpus = yaml.safe_load(path.read_text())
        corpus.pop("served")  # this test's server stands in for a remote one
        port = server.server_address[1]
        corpus["source"]["url"] = corpus["source"]["url"].replace(":18765/", f":{port}/")
        for key in ("vocab_file", "merge_file"):
            corpus["tokenizer"][key] = corpus["tokenizer"][key].replace(":18765/", f":{port}/")
        path.write_text(yaml.safe_dump(corpus))
        run = start(ws, "resources/corpora/mini_corpus/download/tasks.json")
        try:
            def downloading(ws):
                for stage in status(ws, "mini_gpt")["stages"]:
                    if stage["stage"] == "corpus mini_corpus download" and stage["live"] and stage["done"] > 0 \
                            and stage["eta_s"] is not None and stage["rate"]:
                        return stage
            stage = watch(ws, run, downloading, 300, "the download's progress")
            text = status_text(ws, "mini_gpt")
            assert re.search(r"^corpus mini_corpus download: [\d.]+ KiB of [\d.]+ KiB \(\d+%\), [\d.]+ KiB/s, ETA \d+:\d\d$",
                             text, re.M), text
            assert stage["parts"] == 3  # the three download tasks, added up
            assert stage["rate"] < 3 * 2 * 2000 * 1.5  # at most tasks x workers connections at the server's pace
        finally:
            out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out[-4000:]
    finally:
        server.shutdown()
    log = (ws / "logs" / "corpora" / "mini_corpus" / "download.log").read_text()
    lines = [line for line in log.splitlines() if "mlrepro.util.progress" in line and "task 2" in line]
    assert len(lines) >= 3, log[-3000:]
    stamps = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in lines]
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    # steady: never more often than the interval (a line per block would be thousands); the last comes at the end
    assert all(g >= INTERVAL * 0.9 for g in gaps[:-1]), gaps
    assert "done" in lines[-1]
    final = status(ws, "mini_gpt")["stages"][0]
    assert final["finished"] and not final["live"] and final["done"] == final["total"]


def test_status_shows_a_training_mlperf_seed_against_the_reference(mini_lora_data, tmp_path):
    ws = make_workspace(tmp_path / "ws", data_from=mini_lora_data)
    seed = "results/mini_lora/seed_1/mllog.txt"
    run = start(ws, "results/mini_lora/reference.json", seed)
    try:
        def training(ws):
            row = next(s for s in status(ws, "mini_lora")["seeds"] if s["seed"] == 1)
            p = row.get("progress") or {}
            if row["state"] == "running" and p.get("evals", 0) >= 3 and p.get("eta_s") is not None:
                return row
        row = watch(ws, run, training, 900, "the seed's progress")
        p = row["progress"]
        assert p["metric"] == "eval_accuracy" and p["reference_samples"] > p["samples"] > 0
        assert p["samples_per_s"] > 0 and row["reason"].startswith(f"eval {p['evals']}: ")
        text = status_text(ws, "mini_lora")
        line = next(x for x in text.splitlines() if x.startswith("1 "))
        assert "running" in line and "samples" in line and "ETA" in line, text
    finally:
        out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-4000:]
    row = next(s for s in status(ws, "mini_lora")["seeds"] if s["seed"] == 1)
    assert row["state"] == "finishing" and row["progress"] is None  # trained; score_seed has not run (not asked)
