"""mlrepro status: seed states from fabricated seed folders (no Slurm needed) and from a real job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mlrepro import status
from mlrepro.slurm import client as slurm
from mlrepro.cli import main


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


@pytest.fixture
def bench(tmp_path) -> Path:
    """A results/<benchmark> folder with one seed in each situation the launch code leaves."""
    root = tmp_path / "results" / "mini_lora"
    # 1: done and converged
    write(root / "seed_1" / "job.json", {"job_id": "101", "attempt": 1, "nodes": 2})
    write(root / "seed_1" / "run.json", {"seed": 1, "minutes": 2.5, "status": "success", "converged": True})
    write(root / "seed_1" / "mllog.txt", ":::MLLOG {}\n")
    # 2: the last attempt failed
    write(root / "seed_2" / "job.json", {"job_id": "102", "attempt": 2})
    write(root / "seed_2" / "failure.json", {"reason": "NODE_FAIL", "state": "NODE_FAIL", "exit_code": None,
                                             "job_id": "102", "nodes": "node[1-2]"})
    # 3: running, 4: pending, 5: Slurm says completed but no results yet, 6: cancelled
    for seed, job_id in ((3, "103"), (4, "104"), (5, "105"), (6, "106")):
        write(root / f"seed_{seed}" / "job.json", {"job_id": job_id, "attempt": 1})
    # 7: failed earlier, retried: the new job (107) is current, the old failure is history
    write(root / "seed_7" / "failure.json", {"reason": "TIMEOUT", "job_id": "97"})
    time.sleep(0.01)
    write(root / "seed_7" / "job.json", {"job_id": "107", "attempt": 2})
    # 8: run ended with run_stop status aborted
    write(root / "seed_8" / "run.json", {"seed": 8, "minutes": 1.0, "status": "aborted", "converged": False})
    write(root / "seed_8" / "mllog.txt", ":::MLLOG {}\n")
    # 9: folder, nothing in it yet; 10: job.json is corrupt
    (root / "seed_9").mkdir()
    write(root / "seed_10" / "job.json", "{not json")
    (root / "not_a_seed").mkdir()
    return root


SLURM_ANSWERS = {
    "103": slurm.JobInfo("103", state="RUNNING", nodes=["node1", "node2"], elapsed_seconds=75),
    "104": slurm.JobInfo("104", state="PENDING", reason="Resources"),
    "105": slurm.JobInfo("105", state="COMPLETED", exit_code=0, elapsed_seconds=140),
    "106": slurm.JobInfo("106", state="CANCELLED", exit_code=0, signal=15, elapsed_seconds=30),
    "107": slurm.JobInfo("107", state="RUNNING", elapsed_seconds=5, nodes=["node2"]),
}


def fake_job_info(job_id: str) -> slurm.JobInfo:
    return SLURM_ANSWERS.get(job_id, slurm.JobInfo(job_id, state="UNKNOWN"))


def test_each_seed_gets_its_state(bench):
    rows = {r.seed: r for r in status.benchmark_status(bench, seeds=range(1, 13), job_info=fake_job_info)}
    assert {s: r.state for s, r in rows.items()} == {
        1: "done", 2: "failed", 3: "running", 4: "pending", 5: "finishing", 6: "failed", 7: "running",
        8: "failed", 9: "not started", 10: "submitted", 11: "missing", 12: "missing"}
    assert rows[1].elapsed_seconds == 150 and rows[1].converged is True and rows[1].job_id == "101"
    assert rows[2].reason == "NODE_FAIL" and rows[2].nodes == ["node1", "node2"] and rows[2].attempt == 2
    assert rows[3].nodes == ["node1", "node2"] and rows[3].elapsed_seconds == 75
    assert rows[4].reason == "Resources"
    assert rows[6].reason == "CANCELLED" and rows[6].slurm_state == "CANCELLED"
    assert rows[7].job_id == "107" and rows[7].attempt == 2
    assert "aborted" in rows[8].reason
    assert "unreadable" in rows[10].reason


def test_without_slurm_a_submitted_seed_says_so(bench):
    row = status.seed_status(3, bench / "seed_3", job_info=None)
    assert (row.state, row.job_id) == ("submitted", "103")


def test_slurm_errors_do_not_stop_the_report(bench):
    def broken(job_id):
        raise slurm.SlurmError("sacct failed: connection refused")

    row = status.seed_status(3, bench / "seed_3", job_info=broken)
    assert row.state == "submitted" and "connection refused" in row.reason


def test_table_lists_every_seed(bench):
    table = status.format_table(status.benchmark_status(bench, job_info=fake_job_info))
    lines = table.splitlines()
    assert lines[0].split() == ["SEED", "STATE", "JOB", "ELAPSED", "NODES", "SPENT", "REASON"]
    assert len(lines) == 1 + 10
    seed3 = next(line for line in lines if line.startswith("3 "))
    assert "running" in seed3 and "103" in seed3 and "1:15" in seed3 and "node1,node2" in seed3


@pytest.mark.parametrize("text,seeds", [("1-3", [1, 2, 3]), ("0,2,5", [0, 2, 5]), ("1-2,7", [1, 2, 7])])
def test_parse_seeds(text, seeds):
    assert status.parse_seeds(text) == seeds


def test_parse_seeds_rejects_nonsense():
    with pytest.raises(ValueError, match="not a seed list"):
        status.parse_seeds("one")
    with pytest.raises(ValueError, match="backwards"):
        status.parse_seeds("5-1")


def test_cli_json_output(bench, capsys):
    assert main(["status", str(bench), "--no-slurm", "--json", "--seeds", "1-11"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["benchmark"] == "mini_lora"
    states = {row["seed"]: row["state"] for row in report["seeds"]}
    assert states[1] == "done" and states[2] == "failed" and states[11] == "missing"
    assert report["counts"]["done"] == 1 and sum(report["counts"].values()) == 11


def test_cli_rejects_a_missing_folder(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["status", str(tmp_path), "--seeds", "x"]) == 2


@pytest.mark.slurm
def test_status_follows_a_real_job(slurm_cluster, tmp_path, capsys):
    root = tmp_path / "results" / "mini_lora"
    script = tmp_path / "seed.sub"
    script.write_text("#!/bin/bash\nsleep 3\n")
    job_id = slurm.submit(script, nodes=2, env={}, job_name="mlrepro-test-status", output=tmp_path / "out")
    write(root / "seed_1" / "job.json", {"job_id": job_id, "attempt": 1, "nodes": 2})

    deadline = time.monotonic() + 60
    while (row := status.benchmark_status(root, job_info=slurm.job_info)[0]).state != "running":
        assert row.state in ("pending", "submitted", "running"), row
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert row.job_id == job_id and row.nodes == ["node1", "node2"]

    slurm.wait(job_id, poll_seconds=0.5, timeout_seconds=60)
    assert main(["status", str(root), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["seeds"][0]
    assert row["state"] == "finishing" and row["slurm_state"] == "COMPLETED" and row["elapsed_seconds"] >= 3


def test_configured_seed_without_a_folder_is_missing(tmp_path, capsys):
    """A results/<b> folder of a checkout: the seeds config/benchmarks/<b>.yaml lists are expected."""
    from workspace import make_workspace

    ws = make_workspace(tmp_path / "ws")
    results = ws / "results" / "mini_lora"
    for seed in range(1, 11):
        if seed != 3:
            write(results / f"seed_{seed}" / "run.json", {"seed": seed, "minutes": 1.0, "status": "success",
                                                          "converged": True})
            write(results / f"seed_{seed}" / "mllog.txt", ":::MLLOG {}\n")
    assert main(["status", str(results), "--no-slurm"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("3 ")] == [["3", "missing"]]
    assert "10 seeds: 9 done, 1 missing" in out
    # Before the first run there is no folder at all: every configured seed is missing.
    assert main(["status", str(ws / "results" / "llama2_lora"), "--no-slurm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"missing": 10}
