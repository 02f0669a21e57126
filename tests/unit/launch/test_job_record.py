"""The seed's records as types: job.json (mlrepro.paths.JobRecord) of either backend, and plan.json's sbatch
request; both read what the earlier, untyped writers left on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlrepro import paths, status
from mlrepro.launch import job
from mlrepro.paths import JobRecord
from mlrepro.slurm import client as slurm

SEED = "/r/results/b/seed_1"
LINE = ["sbatch", "--parsable", "--export=ALL", "--no-requeue", "--job-name=mlrepro-b-seed1-abcd1234", "--nodes=2",
        "--time=30", "--partition=batch", "--account=proj", "--exclude=n1,n3",
        f"--output={SEED}/attempt_1/slurm-%j.out", f"--chdir={SEED}/attempt_1", "/r/impl/run.sub"]
# job.json as the backends wrote it at f5e9645 (local._record_job, slurm._submit, slurm._attach_or_submit for a
# job found by its name, and the collection after the job's end), key for key and in their order.
OLD_SHAPES = {
    "local": {"scheduler": "local", "host": "node7", "controller_pid": 4242, "owner_pid": 4200,
              "owner_start": 9876543, "attempt": 2, "logdir": f"{SEED}/attempt_2",
              "submitted": "2026-11-26T22:41:45+00:00", "ranks": 8, "walltime_minutes": 30},
    "local, no start time": {"scheduler": "local", "host": "node7", "controller_pid": 1, "owner_pid": 2,
                             "owner_start": None, "attempt": 1, "logdir": f"{SEED}/attempt_1",
                             "submitted": "2026-11-26T22:41:45+00:00", "ranks": 1, "walltime_minutes": 2},
    "slurm, submitted": {"scheduler": "slurm", "job_id": "1234", "attempt": 1, "logdir": f"{SEED}/attempt_1",
                         "exclude": ["n1", "n3"], "sbatch": LINE, "submitted": "2026-11-26T22:41:45+00:00"},
    "slurm, found by name": {"scheduler": "slurm", "job_id": "1240", "attempt": 2, "logdir": f"{SEED}/attempt_2",
                             "submitted": None},
    "slurm, collected": {"scheduler": "slurm", "job_id": "1234", "attempt": 1, "logdir": f"{SEED}/attempt_1",
                         "exclude": [], "sbatch": LINE, "submitted": "2026-11-26T22:41:45+00:00",
                         "collected": "2026-11-26T23:00:00+00:00", "state": "COMPLETED",
                         "end": "2026-11-26T22:59:30", "elapsed_s": 1065, "nodes": ["node1", "node2"]},
    "slurm, found and collected": {"scheduler": "slurm", "job_id": "1240", "attempt": 2,
                                   "logdir": f"{SEED}/attempt_2", "submitted": None,
                                   "collected": "2026-11-26T23:00:00+00:00", "state": "CANCELLED", "end": None,
                                   "elapsed_s": None, "nodes": []},
}


@pytest.mark.parametrize("shape", OLD_SHAPES)
def test_job_json_of_either_backend_reads_and_writes_back_unchanged(tmp_path, shape):
    old = OLD_SHAPES[shape]
    (tmp_path / "job.json").write_text(json.dumps(old))
    record = paths.read_job(tmp_path)
    assert isinstance(record, JobRecord)
    assert (record.scheduler, record.attempt, record.logdir) == (old["scheduler"], old["attempt"], Path(old["logdir"]))
    assert list(record.to_json().items()) == list(old.items())
    job.write_job(tmp_path, record)
    assert json.loads((tmp_path / "job.json").read_text()) == old


def test_a_job_record_has_its_backends_fields(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps(OLD_SHAPES["local"]))
    local = paths.read_job(tmp_path)
    assert (local.host, local.owner_pid, local.owner_start, local.job_id) == ("node7", 4200, 9876543, None)
    (tmp_path / "job.json").write_text(json.dumps(OLD_SHAPES["slurm, collected"]))
    collected = paths.read_job(tmp_path)
    assert (collected.job_id, collected.state, collected.nodes, collected.sbatch) == (
        "1234", "COMPLETED", ("node1", "node2"), tuple(LINE))
    assert slurm.SbatchRequest.from_argv(collected.sbatch).render() == LINE


def test_unknown_keys_and_hand_written_records_survive(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({**OLD_SHAPES["slurm, submitted"], "note": "kept"}))
    assert paths.read_job(tmp_path).to_json()["note"] == "kept"
    # What `mlrepro status`'s tests write by hand: a job id as a number, a node count instead of names.
    (tmp_path / "job.json").write_text(json.dumps({"job_id": 101, "attempt": 1, "nodes": 2}))
    record = paths.read_job(tmp_path)
    assert (record.job_id, record.attempt, record.nodes, record.scheduler) == ("101", 1, None, None)


def test_an_unreadable_job_json_is_none_or_named(tmp_path):
    assert paths.read_job(tmp_path) is None and paths.read_job(tmp_path, strict=True) is None
    (tmp_path / "job.json").write_text('{"job_id": "12')
    assert paths.read_job(tmp_path) is None
    with pytest.raises(paths.RecordUnreadable, match="job.json is unreadable"):
        paths.read_job(tmp_path, strict=True)
    (tmp_path / "job.json").write_text("[1]")
    with pytest.raises(paths.RecordUnreadable, match="job.json is not a JSON object"):
        paths.read_job(tmp_path, strict=True)


@pytest.mark.parametrize("shape", ["local", "slurm, submitted", "slurm, collected"])
def test_status_reads_either_shape(tmp_path, shape):
    folder = tmp_path / "results" / "b" / "seed_1"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps(OLD_SHAPES[shape]))
    row = status.seed_status(1, folder, job_info=None)
    if shape == "local":  # no Slurm job: its state is its log's (none here)
        assert (row.state, row.job_id) == (status.NOT_STARTED, None)
    else:
        assert (row.state, row.job_id, row.attempt) == (status.SUBMITTED, "1234", 1)
    assert row.nodes == (["node1", "node2"] if shape == "slurm, collected" else None)


# plan.json as SeedPlan.to_json wrote it at f5e9645: the sbatch line itself (a Slurm seed), [] (a local one).
OLD_PLAN = {"benchmark": "b", "seed": 1, "scheduler": "slurm", "implementation_dir": "/r/impl",
            "config_file": "/r/impl/config_DGXH100_2x8.sh", "dgxsystem": "DGXH100_2x8", "nodes": 2, "gpus_per_node": 8,
            "walltime_minutes": 30, "seed_dir": SEED, "env": {"SEED": "1"}, "job_name": "mlrepro-b-seed1-abcd1234",
            "sbatch": ["sbatch", "--parsable", "--export=ALL", "--no-requeue", "--job-name=mlrepro-b-seed1-abcd1234",
                       "--nodes=2", "--time=30", "--partition=batch", "--account=proj", "--exclude=n1",
                       "/r/impl/run.sub"],
            "generated": False, "description": "", "gpus": 0, "ranks": 16}
OLD_DESCRIBE = ("2 nodes x 8 GPUs (DGXH100_2x8), wall-time 30 min: sbatch --parsable --export=ALL --no-requeue "
                "--job-name=mlrepro-b-seed1-abcd1234 --nodes=2 --time=30 --partition=batch --account=proj "
                "--exclude=n1 /r/impl/run.sub")


def test_an_earlier_plan_json_still_loads_and_describes_itself_the_same(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(OLD_PLAN))
    plan = job.read_plan(tmp_path)
    assert plan.sbatch == slurm.SbatchRequest("/r/impl/run.sub", nodes=2, time_minutes=30, partition="batch",
                                              account="proj", exclude=("n1",), job_name="mlrepro-b-seed1-abcd1234")
    assert plan.describe() == OLD_DESCRIBE
    (tmp_path / "plan.json").write_text(json.dumps({**OLD_PLAN, "scheduler": "local", "sbatch": []}))
    local = job.read_plan(tmp_path)
    assert local.sbatch is None and local.describe().endswith(": local run_and_time.sh through submitit")


def test_a_plan_keeps_its_request_as_fields(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(OLD_PLAN))
    plan = job.read_plan(tmp_path)
    record = plan.to_json()
    assert record["sbatch"]["nodes"] == 2 and record["sbatch"]["exclude"] == ["n1"] and record["sbatch"]["signal"] is None
    assert job.SeedPlan.from_json(json.loads(json.dumps(record))) == plan
    assert job.SeedPlan.from_json(json.loads(json.dumps(record))).describe() == OLD_DESCRIBE
