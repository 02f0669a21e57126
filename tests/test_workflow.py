"""The real snakemake on the real miniature: the whole DAG, reruns, kills, bad config.

One workspace runs the full 10-seed pipeline once (module fixture); the tests around it
check what a user relies on: a second invocation runs nothing, a deleted seed is the only
one recomputed, a killed workflow leaves no target a rerun would trust.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from workspace import make_workspace, planned_jobs, run_snakemake, snakemake_cmd

pytestmark = pytest.mark.slow

TARGET = "results/mini_lora/score.json"
PROFILE = ("--profile", "profiles/local")


def test_bad_config_stops_before_any_job(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    data = yaml.safe_load(bench.read_text())
    data["required_runs"] = -3
    bench.write_text(yaml.safe_dump(data))
    proc = run_snakemake(ws, *PROFILE, TARGET, check=False, timeout=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "config/benchmarks/mini_lora.yaml" in out and "required_runs: -3" in out
    assert not (ws / "results").exists() and not (ws / "resources").exists()


def test_dry_run_plans_one_job_per_seed(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = run_snakemake(ws, *PROFILE, TARGET, "-n", timeout=120)
    jobs = planned_jobs(proc.stdout)
    assert jobs["train_seed"] == 10 and jobs["score_seed"] == 10
    assert jobs["dataset"] == 1 and jobs["base_checkpoint"] == 1 and jobs["score"] == 1
    # the plan says what each seed will be given
    assert proc.stdout.count("1 node x 2 GPUs (CPU_1x2x8xtp1pp1cp1)") == 10
    assert not (ws / "results").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A workspace whose first invocation was killed mid-seed, then run to the end."""
    ws = make_workspace(tmp_path_factory.mktemp("mini") / "ws")
    proc = subprocess.Popen(
        snakemake_cmd(*PROFILE, TARGET), cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    results = ws / "results" / "mini_lora"

    def seed_mid_run():
        # training has started (MLLOG lines in its log) and the seed is not done
        for log in results.glob("seed_*/run.log"):
            if ":::MLLOG" in log.read_text(errors="replace") and not (log.parent / "mllog.txt").exists():
                return log.parent
        return None

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and (mid := seed_mid_run()) is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.stdout.read()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)  # anything the kill left running would write now
    done = sorted(int(p.parent.name.split("_")[1]) for p in results.glob("seed_*/mllog.txt"))
    killed = {"seed_dir": mid, "had_mllog": (mid / "mllog.txt").exists(), "done": done}
    # The dataset and checkpoint finished before any seed started; they must be trusted.
    killed["plan_after_kill"] = planned_jobs(run_snakemake(ws, *PROFILE, TARGET, "-n").stdout)
    # A killed snakemake leaves its lock; --unlock is what its error message tells the user.
    run_snakemake(ws, *PROFILE, "--unlock")
    started = time.monotonic()
    run = run_snakemake(ws, *PROFILE, TARGET, "results/mini_lora/report.html")
    return {"ws": ws, "killed": killed, "run": run, "seconds": time.monotonic() - started}


def test_kill_mid_seed_leaves_no_trusted_target(finished):
    killed = finished["killed"]
    assert not killed["had_mllog"], "a killed seed left mllog.txt behind"
    plan = killed["plan_after_kill"]
    assert plan.get("train_seed") == 10 - len(killed["done"])
    assert "dataset" not in plan and "base_checkpoint" not in plan


def test_full_run_scores_ten_seeds(finished):
    ws = finished["ws"]
    score = json.loads((ws / TARGET).read_text())
    runs = score["runs"]
    assert len(runs) == 10
    assert sorted(r["seed"] for r in runs) == list(range(1, 11))
    converged = [r for r in runs if r["converged"]]
    assert len(converged) >= 9
    minutes = sorted(r["minutes"] for r in runs if r["converged"])
    assert score["valid"] is True
    # olympic mean by the rule: drop the fastest and slowest of the 10 times
    times = sorted(r["minutes"] if r["converged"] else float("inf") for r in runs)
    assert score["olympic_minutes"] == pytest.approx(sum(times[1:-1]) / 8, rel=1e-6)
    assert len(set(minutes)) > 1, "seeds should differ in time to train"
    for seed in range(1, 11):
        seed_dir = ws / "results" / "mini_lora" / f"seed_{seed}"
        assert ":::MLLOG" in (seed_dir / "mllog.txt").read_text()
        assert not (seed_dir / "failure.json").exists()
    manifest = json.loads((ws / "resources/mini_lora/checkpoint/manifest.json").read_text())
    assert any(f["path"].endswith(".safetensors") for f in manifest["files"])
    assert (ws / "results/mini_lora/report.html").stat().st_size > 1000


def test_second_invocation_runs_nothing(finished):
    ws = finished["ws"]
    for target in ((TARGET,), ()):  # the score, and the default target (every configured benchmark)
        proc = run_snakemake(ws, *PROFILE, *target, "-n")
        assert planned_jobs(proc.stdout) == {}
        assert "Nothing to be done" in proc.stdout + proc.stderr


def test_deleted_seed_is_the_only_one_recomputed(finished):
    """README's rerun: delete a seed's folder, run the card's explicit target: that seed, the
    score and the report run again, nothing else (and the default target plans the same)."""
    import shutil

    ws = finished["ws"]
    results = ws / "results" / "mini_lora"
    others = {p: p.stat().st_mtime_ns for p in results.glob("seed_*/mllog.txt") if "seed_4" not in str(p)}
    report = (results / "report.html").stat().st_mtime_ns
    shutil.rmtree(results / "seed_4")
    status = subprocess.run([sys.executable, "-m", "mlrepro", "status", "results/mini_lora", "--no-slurm"], cwd=ws,
                            capture_output=True, text=True, timeout=120)
    assert re.search(r"^4\s+missing\b", status.stdout, flags=re.M), status.stdout
    assert "10 seeds: 9 done, 1 missing" in status.stdout, status.stdout
    assert planned_jobs(run_snakemake(ws, *PROFILE, "-n").stdout) == {"train_seed": 1, "score_seed": 1, "score": 1,
                                                                     "all": 1}
    assert planned_jobs(run_snakemake(ws, *PROFILE, TARGET, "-n").stdout) == {"train_seed": 1, "score_seed": 1,
                                                                             "score": 1}
    run_snakemake(ws, *PROFILE, TARGET)
    assert (results / "seed_4" / "mllog.txt").exists()
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert (results / "report.html").stat().st_mtime_ns > report
    assert 4 in [r["seed"] for r in json.loads((ws / TARGET).read_text())["runs"]]
    # Back to complete: neither target plans anything.
    for target in ((TARGET,), ()):
        assert planned_jobs(run_snakemake(ws, *PROFILE, *target, "-n").stdout) == {}


def test_snakemake_report_includes_score_and_plots(finished, tmp_path):
    import zipfile

    ws = finished["ws"]
    run_snakemake(ws, *PROFILE, "results/mini_lora/report.html", "--report", str(tmp_path / "report.zip"))
    names = [Path(n).name for n in zipfile.ZipFile(tmp_path / "report.zip").namelist()]
    for item in ("score.json", "report.html", "convergence.svg", "time_to_train.svg"):
        assert item in names, f"{item} missing from snakemake --report"
