"""mlrepro.slurm.client: parsing and redaction without Slurm; submit/wait/cancel against the real local cluster."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import stat
import threading
import time
from pathlib import Path

import pytest

from mlrepro.slurm import client as slurm
from workspace import wait_for

# ---------------------------------------------------------------- fixture


def cluster_state_dir() -> Path:
    from mlrepro.slurm.testcluster import state_dir_from_env

    return state_dir_from_env()


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- unit: parsing

# Lines as Debian's Slurm 22.05 sacct prints them for
# `sacct -X -P -n -o JobIDRaw,State,ExitCode,NodeList,ElapsedRaw,Submit,Start,End,Reason,ConsumedEnergyRaw,JobName`
# (ConsumedEnergyRaw: joules where an AcctGatherEnergyType plugin gathers it, as on job 1; else 0 or empty).
SACCT_SAMPLE = """\
1|COMPLETED|0:0|node[1-2]|4|2026-11-21T06:09:04|2026-11-21T06:09:05|2026-11-21T06:09:09|None|5120|j.sh
2|FAILED|3:0|node1|0|2026-11-21T06:09:33|2026-11-21T06:09:33|2026-11-21T06:09:33|None|0|f.sh
3|CANCELLED by 0|0:15|node1|2|2026-11-21T06:09:33|2026-11-21T06:09:33|2026-11-21T06:09:35|None||s.sh
4|PENDING|0:0|None assigned|0|2026-11-21T06:10:00|Unknown|Unknown|Resources|18446744073709551614|mlrepro|seed 4
"""


def test_parse_sacct_normalizes_states_exit_codes_and_nodes():
    jobs = slurm.parse_sacct(SACCT_SAMPLE)
    assert [j.job_id for j in jobs] == ["1", "2", "3", "4"]
    assert [j.state for j in jobs] == ["COMPLETED", "FAILED", "CANCELLED", "PENDING"]
    assert jobs[0].nodes == ["node1", "node2"] and jobs[0].elapsed_seconds == 4
    assert (jobs[1].exit_code, jobs[1].signal) == (3, 0)
    assert jobs[2].raw_state == "CANCELLED by 0" and jobs[2].signal == 15
    pending = jobs[3]
    assert pending.nodes == [] and pending.start is None and pending.end is None
    assert pending.reason == "Resources"
    assert pending.name == "mlrepro|seed 4"  # a '|' in the job name survives
    assert [j.terminal for j in jobs] == [True, True, True, False]
    # Energy only where sacct has a figure: 0, empty and Slurm's NO_VAL64 are "not gathered".
    assert [j.energy_j for j in jobs] == [5120.0, None, None, None]


def test_parse_sacct_rejects_a_short_line():
    with pytest.raises(slurm.SlurmError, match="unexpected sacct line"):
        slurm.parse_sacct("12|COMPLETED|0:0\n")


def test_parse_squeue_reads_running_and_pending_jobs():
    text = ("7|RUNNING|node[1-2]|1:02:03|2026-11-21T06:09:04|2026-11-21T06:09:05|None|seed_1\n"
            "8|PENDING||0:00|2026-11-21T06:09:04|N/A|Resources|seed_2\n")
    running, pending = slurm.parse_squeue(text)
    assert running.state == "RUNNING" and running.nodes == ["node1", "node2"]
    assert running.elapsed_seconds == 3723
    assert pending.state == "PENDING" and pending.reason == "Resources" and pending.start is None


SCONTROL_SAMPLE = (
    "JobId=6 JobName=mini lora seed 3 UserId=root(0) GroupId=root(0) JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=3:0 RunTime=00:01:05 TimeLimit=00:05:00 "
    "SubmitTime=2026-11-21T06:10:35 StartTime=2026-11-21T06:10:36 EndTime=2026-11-21T06:11:41 "
    "Partition=debug AllocNode:Sid=localhost:4546 NodeList=node[1-2] BatchHost=node1 NumNodes=2 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* Command=/tmp/run.sub WorkDir=/work StdOut=/tmp/x.out Power= "
    "TresPerNode=gres:gpu:4 \n")


def test_parse_scontrol_job():
    info = slurm.parse_scontrol_job(SCONTROL_SAMPLE)
    assert (info.job_id, info.name, info.state, info.exit_code) == ("6", "mini lora seed 3", "FAILED", 3)
    assert info.nodes == ["node1", "node2"] and info.elapsed_seconds == 65 and info.reason == "NonZeroExitCode"
    assert info.start == "2026-11-21T06:10:36" and info.end == "2026-11-21T06:11:41"
    pending = slurm.parse_scontrol_job(SCONTROL_SAMPLE.replace("JobState=FAILED", "JobState=PENDING"))
    assert pending.state == "PENDING" and pending.nodes == [] and pending.end is None
    assert slurm.parse_scontrol_job("") is None


@pytest.mark.parametrize("raw,expected", [
    ("COMPLETED", "COMPLETED"), ("CANCELLED by 1000", "CANCELLED"), ("COMPLETING", "RUNNING"),
    ("CONFIGURING", "RUNNING"), ("REQUEUED", "PENDING"), ("BOOT_FAIL", "NODE_FAIL"), ("DEADLINE", "TIMEOUT"),
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("PREEMPTED", "PREEMPTED"), ("CD", "COMPLETED"), ("TO", "TIMEOUT"),
    ("RUNNING+", "RUNNING"), ("", "UNKNOWN"), ("WHATEVER", "UNKNOWN"),
])
def test_normalize_state(raw, expected):
    assert slurm.normalize_state(raw) == expected


def test_terminal_states():
    assert all(slurm.is_terminal(s) for s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                              "OUT_OF_MEMORY", "PREEMPTED", "CANCELLED by 0"))
    assert not any(slurm.is_terminal(s) for s in ("PENDING", "RUNNING", "UNKNOWN", "COMPLETING"))


@pytest.mark.parametrize("text,hosts", [
    ("node[1-2]", ["node1", "node2"]),
    ("gpu[01-03,07],login", ["gpu01", "gpu02", "gpu03", "gpu07", "login"]),
    ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
    ("n1,n2", ["n1", "n2"]),
    ("None assigned", []),
    ("", []),
])
def test_expand_hostlist(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


def test_parse_duration():
    assert slurm.parse_duration("1-02:03:04") == 93784
    assert slurm.parse_duration("03:04") == 184
    assert slurm.parse_duration("1:00:00") == 3600
    assert slurm.parse_duration("INVALID") is None


# ---------------------------------------------------------------- unit: command line (redaction: test_secrets.py)


def test_an_sbatch_request_carries_each_option_once():
    command = slurm.SbatchRequest(
        "impl/run.sub", nodes=2, time_minutes=12.5, partition="debug", account="acct",
        exclude=["node2", "node1", "node2"], job_name="mini_lora-seed_3", output="results/seed_3/slurm-%j.out",
        extra_args=["--gpus-per-node=4"], workdir="impl").render()
    assert command == [
        "sbatch", "--parsable", "--export=ALL", "--no-requeue", "--job-name=mini_lora-seed_3", "--nodes=2", "--time=13",
        "--partition=debug", "--account=acct", "--exclude=node1,node2", "--output=results/seed_3/slurm-%j.out",
        "--chdir=impl", "--gpus-per-node=4", "impl/run.sub"]
    assert slurm.SbatchRequest("run.sub").render() == ["sbatch", "--parsable", "--export=ALL", "--no-requeue", "run.sub"]
    with pytest.raises(ValueError, match="nodes"):
        slurm.SbatchRequest("run.sub", nodes=0)


def test_an_attempt_sets_its_own_folders_and_excludes_on_the_plans_request():
    plan = slurm.SbatchRequest("impl/run.sub", nodes=2, time_minutes=5, exclude=["node9"], job_name="j")
    attempt = dataclasses.replace(plan, exclude=["node9", "node1"], output="a_2/slurm-%j.out", workdir="a_2")
    assert attempt.render() == ["sbatch", "--parsable", "--export=ALL", "--no-requeue", "--job-name=j", "--nodes=2",
                                "--time=5", "--exclude=node1,node9", "--output=a_2/slurm-%j.out", "--chdir=a_2",
                                "impl/run.sub"]
    assert dataclasses.replace(attempt, exclude=(), output=None, workdir=None).render() == [
        "sbatch", "--parsable", "--export=ALL", "--no-requeue", "--job-name=j", "--nodes=2", "--time=5", "impl/run.sub"]


def test_submit_of_a_missing_script_names_it(tmp_path):
    with pytest.raises(slurm.SlurmError, match="does not exist"):
        slurm.submit(tmp_path / "nope.sub", env={})


# ---------------------------------------------------------------- real cluster


@pytest.mark.slurm
def test_eight_tasks_over_two_nodes_complete(slurm_cluster, tmp_path, caplog):
    script = write_script(tmp_path / "tasks.sub",
                          'echo "batch gpus=$SLURM_GPUS_ON_NODE visible=$CUDA_VISIBLE_DEVICES seed=$SEED"\n'
                          'srun bash -c \'echo "task $SLURM_PROCID on $SLURMD_NODENAME"\'\n')
    out = tmp_path / "tasks.out"
    secret = "hf_secret_value_123"
    seen: list[str] = []
    caplog.set_level(logging.DEBUG, logger="mlrepro.slurm.client")
    t0 = time.monotonic()
    job_id = slurm.submit(script, nodes=2, time_minutes=5, partition="debug", job_name="mlrepro-test-tasks",
                          output=out, env={"SEED": "42", "HF_TOKEN": secret},
                          extra_args=["--ntasks-per-node=4", "--gpus-per-node=4"])
    info = slurm.wait(job_id, poll_seconds=0.5, on_state=lambda i: seen.append(i.state), timeout_seconds=120)
    assert info.state == "COMPLETED", info
    assert info.exit_code == 0 and info.nodes == ["node1", "node2"] and info.name == "mlrepro-test-tasks"
    assert seen[-1] == "COMPLETED" and len(seen) == len(set(seen))
    lines = out.read_text().splitlines()
    (batch,) = [line for line in lines if line.startswith("batch ")]
    assert batch.startswith("batch gpus=4 ") and batch.endswith(" seed=42")
    # Slurm sets CUDA_VISIBLE_DEVICES only where the GPU stand-ins are device
    # files (mknod allowed), which is the case on a root Debian machine.
    gpu0 = cluster_state_dir() / "gpus" / "node1" / "gpu0"
    if stat.S_ISCHR(gpu0.stat().st_mode):
        assert "visible=0,1,2,3 " in batch
    tasks = sorted(line for line in lines if line.startswith("task "))
    assert len(tasks) == 8
    assert {t.split()[-1] for t in tasks} == {"node1", "node2"}
    assert {int(t.split()[1]) for t in tasks} == set(range(8))
    # the secret reached the job's environment but not the log
    assert secret not in caplog.text and "submitting: sbatch" in caplog.text
    assert time.monotonic() - t0 < 60
    found = slurm.find_jobs("mlrepro-test-tasks")
    assert job_id in [j.job_id for j in found]


@pytest.mark.slurm
def test_failing_script_gives_failed_with_its_exit_code(slurm_cluster, tmp_path):
    script = write_script(tmp_path / "fail.sub", "echo about to fail\nexit 3\n")
    job_id = slurm.submit(script, output=tmp_path / "fail.out", env={}, job_name="mlrepro-test-fail")
    info = slurm.wait(job_id, poll_seconds=0.5, timeout_seconds=120)
    assert (info.state, info.exit_code) == ("FAILED", 3)
    assert slurm.job_info(job_id).state == "FAILED"


@pytest.mark.slurm
def test_scancel_gives_cancelled(slurm_cluster, tmp_path):
    script = write_script(tmp_path / "sleep.sub", "sleep 300\n")
    job_id = slurm.submit(script, output=tmp_path / "sleep.out", env={}, job_name="mlrepro-test-cancel")
    deadline = time.monotonic() + 60
    while slurm.job_info(job_id).state != "RUNNING":
        assert time.monotonic() < deadline, "job did not start within 60 s"
        time.sleep(0.3)
    running = [j for j in slurm.find_jobs("mlrepro-test-cancel") if j.job_id == job_id]
    assert running and running[0].state == "RUNNING"
    slurm.cancel(job_id)
    info = slurm.wait(job_id, poll_seconds=0.5, timeout_seconds=60)
    assert info.state == "CANCELLED"


@pytest.mark.slurm
def test_sinfo_says_which_nodes_are_out_of_service(slurm_cluster):
    # the cluster the tests share is healthy: taking a node down would fail the others' jobs
    assert slurm.out_of_service(["node1", "node2"]) == {}
    assert slurm.out_of_service([]) == {}


@pytest.mark.slurm
def test_a_bad_node_is_excluded_from_the_seeds_queued_already(slurm_cluster, tmp_path):
    """Issue 24 item 4: a node found bad mid-reproduction was kept out of seeds submitted after it, but a
    seed queued before started on it. Held jobs stand for queued seeds: two in the reproduction's
    results/ (one with an exclusion of its own, which must stay), one elsewhere (not ours to change), and
    one that needs both nodes."""
    script = write_script(tmp_path / "sleep.sub", "sleep 300\n")
    seeds = [tmp_path / "results" / "b" / f"seed_{n}" / "attempt_1" for n in (1, 2)]
    other = tmp_path / "elsewhere"
    for folder in (*seeds, other):
        folder.mkdir(parents=True)
    jobs = [slurm.submit(script, env={}, job_name="mlrepro-test-queued", workdir=seeds[0], extra_args=["--hold"]),
            slurm.submit(script, env={}, job_name="mlrepro-test-queued", workdir=seeds[1], exclude=["node1"],
                         extra_args=["--hold"]),
            slurm.submit(script, env={}, job_name="mlrepro-test-queued", workdir=other, extra_args=["--hold"]),
            # Needs both nodes: kept off node2 it could never start (pending for ever, BadConstraints).
            slurm.submit(script, env={}, job_name="mlrepro-test-queued", workdir=seeds[0], nodes=2,
                         extra_args=["--hold"])]
    try:
        updated = slurm.exclude_from_pending(tmp_path / "results", ["node2"])
        assert updated == jobs[:1]
        excluded = {j: re.search(r"ExcNodeList=(\S+)", subprocess.run(["scontrol", "show", "job", j], capture_output=True,
                                                                      text=True, check=True).stdout).group(1)
                    for j in jobs}
        assert excluded[jobs[0]] == "node2" and excluded[jobs[2]] == "(null)"
        # Kept off node2 too, the job with an exclusion of its own (node1) and the one that needs both
        # nodes could never start on this two-node cluster: both are left as they are.
        assert excluded[jobs[1]] == "node1" and excluded[jobs[3]] == "(null)"
        assert slurm.exclude_from_pending(tmp_path / "results", ["node2"]) == []  # once is enough
    finally:
        for j in jobs:
            slurm.cancel(j)


@pytest.mark.slurm
def test_sbatch_refusal_carries_slurms_message(slurm_cluster, tmp_path):
    script = write_script(tmp_path / "ok.sub", "true\n")
    with pytest.raises(slurm.SlurmError, match="(?i)invalid partition"):
        slurm.submit(script, partition="no-such-partition", env={}, job_name="mlrepro-test-refused")
    # each node has 4 GPUs: a request for 5 per node can never be met
    with pytest.raises(slurm.SlurmError, match="(?i)requested node configuration is not available"):
        slurm.submit(script, env={}, job_name="mlrepro-test-refused", extra_args=["--gpus-per-node=5"])
    # Slurm records a refused submission in accounting as a FAILED job, but
    # nothing of it is queued or running.
    assert all(j.terminal for j in slurm.find_jobs("mlrepro-test-refused"))


def _accounting_sql(sql: str) -> str:
    from mlrepro.slurm import testcluster

    layout = testcluster.Layout(testcluster.state_dir_from_env())
    return testcluster._mariadb(layout, f"USE {testcluster.DB_NAME}; {sql}")


@pytest.mark.slurm
def test_a_runaway_accounting_record_is_never_waited_on(slurm_cluster, tmp_path):
    """A job accounting still calls RUNNING that slurmctld no longer holds (its state lost, or the end
    never recorded: a "runaway" job) is UNKNOWN to job_info and left out by find_jobs, so neither a
    seed's re-attach nor a corpus array's wait for an earlier array waits on it forever."""
    from mlrepro.slurm import testcluster

    name = f"mlrepro-test-runaway-{time.time_ns()}"
    done = slurm.submit(write_script(tmp_path / "ok.sub", "true\n"), output=tmp_path / "ok.out", env={}, job_name=name)
    assert slurm.wait(done, poll_seconds=0.3, timeout_seconds=120).state == "COMPLETED"
    table = f"{testcluster.CLUSTER_NAME}_job_table"

    def recorded():
        return _accounting_sql(f"SELECT job_db_inx FROM {table} WHERE id_job={done} AND time_end>0").split()

    inx = wait_for(recorded, 60, "accounting to record the job's end")[0]
    runaway = str(990_000_000 + int(time.time()) % 1_000_000)
    columns = [c for c in _accounting_sql(f"SHOW COLUMNS FROM {table}").split("\n") if c]
    names = [c.split("\t")[0] for c in columns if c.split("\t")[0] != "job_db_inx"]
    values = {"id_job": runaway, "state": "1", "time_end": "0", "exit_code": "0"}  # 1: JOB_RUNNING
    _accounting_sql(f"INSERT INTO {table} ({', '.join(f'`{n}`' for n in names)}) SELECT "
                    f"{', '.join(values.get(n, f'`{n}`') for n in names)} FROM {table} WHERE job_db_inx={inx}")
    try:
        assert wait_for(lambda: [r for r in slurm._sacct_jobs(["-j", runaway]) if r.job_id == runaway],
                        30, "sacct to list the runaway record")[0].state == "RUNNING"  # what accounting says
        info = slurm.job_info(runaway)
        assert info.state == "UNKNOWN" and "runaway" in info.reason and not info.terminal
        with pytest.raises(slurm.SlurmError, match="does not know"):
            slurm.wait(runaway, poll_seconds=0.2, unknown_grace_seconds=0.5)
        found = {j.job_id: j.state for j in slurm.find_jobs(name)}
        assert found == {str(done): "COMPLETED"}
    finally:
        _accounting_sql(f"DELETE FROM {table} WHERE id_job={runaway}")


@pytest.mark.slurm
def test_unknown_job_is_unknown(slurm_cluster):
    info = slurm.job_info("987654321")
    assert info.state == "UNKNOWN" and not info.terminal
    with pytest.raises(slurm.SlurmError, match="does not know"):
        slurm.wait("987654321", poll_seconds=0.2, unknown_grace_seconds=0.5)


@pytest.mark.slurm
@pytest.mark.slow
def test_job_over_its_time_limit_gives_timeout(slurm_cluster, tmp_path):
    script = write_script(tmp_path / "long.sub", "sleep 600\n")
    job_id = slurm.submit(script, time_minutes=1, output=tmp_path / "long.out", env={},
                          job_name="mlrepro-test-timeout")
    info = slurm.wait(job_id, poll_seconds=1, timeout_seconds=200)
    assert info.state == "TIMEOUT"
    assert 60 <= info.elapsed_seconds <= 150


def _reattached_seed(tmp_path: Path, job_id: str):
    """A seed whose job.json names Slurm job `job_id`, submitted by an earlier invocation that died
    before it read the job's end (job.json not `collected`)."""
    from mlrepro import config as mlrepro_config
    from mlrepro.launch import job as launch_job

    seed_dir = tmp_path / "results" / "b" / "seed_1"
    logdir = seed_dir / "attempt_1"
    logdir.mkdir(parents=True)
    (seed_dir / "job.json").write_text(json.dumps({"scheduler": "slurm", "job_id": job_id, "attempt": 1,
                                                   "logdir": str(logdir), "submitted": None}))
    plan = launch_job.SeedPlan(benchmark="b", seed=1, scheduler="slurm", implementation_dir=tmp_path,
                               config_file=tmp_path / "config_X.sh", dgxsystem="X", nodes=1, gpus_per_node=1,
                               walltime_minutes=5, seed_dir=seed_dir, env={}, job_name="mlrepro-test-reattach")
    system = mlrepro_config.System(name="s", scheduler="slurm", nodes=2, gpus_per_node=4, slurm_poll_seconds=0.3)
    return plan, system


@pytest.mark.slurm
def test_a_seed_scancelled_while_an_earlier_invocation_ran_is_retried_by_the_rerun(slurm_cluster, tmp_path):
    """A scancel is someone's decision for the invocation it was made in: that one does not retry the
    seed, and running the workflow again runs it again. Seen in the soak: a seed cancelled just before
    the workflow was killed, re-attached by the rerun, was failed instead of retried."""
    from mlrepro.launch import job as launch_job
    from mlrepro.launch import slurm as launch_slurm

    script = write_script(tmp_path / "sleep.sub", "sleep 300\n")
    before = slurm.submit(script, output=tmp_path / "before.out", env={}, job_name="mlrepro-test-reattach")
    slurm.cancel(before)
    assert slurm.wait(before, poll_seconds=0.3, timeout_seconds=60).state == "CANCELLED"
    plan, system = _reattached_seed(tmp_path / "earlier", before)
    with pytest.raises(launch_job.SeedFailed, match="CANCELLED") as failed:
        launch_slurm.run_seed_slurm(plan, system, plan.seed_dir / "run.log")
    assert failed.value.retry, "a job cancelled before this invocation must not stop its retry"

    during = slurm.submit(script, output=tmp_path / "during.out", env={}, job_name="mlrepro-test-reattach")
    plan, system = _reattached_seed(tmp_path / "now", during)
    threading.Timer(2.0, slurm.cancel, args=(during,)).start()
    with pytest.raises(launch_job.SeedFailed, match="CANCELLED") as failed:
        launch_slurm.run_seed_slurm(plan, system, plan.seed_dir / "run.log")
    assert not failed.value.retry, "a job cancelled while this invocation waits on it stays failed"


@pytest.mark.slurm
def test_a_hung_slurm_attempt_is_scancelled_by_the_watch_and_named(slurm_cluster, tmp_path):
    """The hang watch on Slurm: it starts counting when the job runs (not while it queues), follows the
    attempt's logs, and a quiet job is scancelled and recorded hung with its last line and nodes."""
    from mlrepro import config as mlrepro_config
    from mlrepro.launch import job as launch_job
    from mlrepro.launch import slurm as launch_slurm

    impl = tmp_path / "impl"
    impl.mkdir()
    write_script(impl / "run.sub", 'log="$LOGDIR/${DATESTAMP:-0}_1.log"\n'
                 'for i in 1 2 3; do echo "tiny progress: step $i/100 tokens 1 loss 3.0 iter_s 0.1" >> "$log"; sleep 0.5; done\n'
                 'echo "waiting on a peer that never answers" >> "$log"\nsleep 300\n')
    seed_dir = tmp_path / "results" / "b" / "seed_1"
    system = mlrepro_config.System(name="s", scheduler="slurm", nodes=2, gpus_per_node=4, slurm_poll_seconds=0.5)
    plan = launch_job.with_sbatch(launch_job.SeedPlan(
        benchmark="b", seed=1, scheduler="slurm", implementation_dir=impl, config_file=impl / "config_X.sh",
        dgxsystem="X", nodes=1, gpus_per_node=1, walltime_minutes=5, seed_dir=seed_dir, env={},
        job_name=launch_job.job_name("b", 1, seed_dir), hang={"floor_seconds": 3, "multiple": 5, "startup_seconds": 20}),
        system)
    started = time.monotonic()
    with pytest.raises(launch_job.SeedFailed, match="hung: no progress for") as failed:
        launch_slurm.run_seed_slurm(plan, system, seed_dir / "run.log")
    assert failed.value.retry  # a hang is retried (from the last checkpoint), not a decision of someone's
    assert time.monotonic() - started < 60  # 3 s floor (5 x 0.5 s is less) + polling, not the job's 300 s
    failure = json.loads((seed_dir / "failure.json").read_text())
    assert failure["state"] == "HUNG" and failure["nodes"] and "never answers" in failure["last_line"]
    job = json.loads((seed_dir / "job.json").read_text())
    assert slurm.job_info(job["job_id"]).state == "CANCELLED"
