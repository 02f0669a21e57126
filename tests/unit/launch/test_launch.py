"""mlrepro.launch (job model, local backend), kinds.mlperf's plan and the seed stage, without Snakemake: plans, the local path through
submitit with a tiny real implementation, failures, retries and the seed folder contract."""

from __future__ import annotations

import json
import time
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from mlrepro import paths
from mlrepro import config
from mlrepro.kinds import mlperf
from mlrepro.launch import job as launch
from mlrepro.stages import data as stages_data
from mlrepro.stages import train as stages
import workspace

REPO = workspace.REPO

# A run_and_time.sh that behaves like a trainer: MLLOG on stdout, and a knob to fail the
# first N attempts (counted in a file), to time out, or to stop without run_stop.
RUN_AND_TIME = textwrap.dedent("""\
    #!/bin/bash
    set -eu
    count_file="$LOGDIR/../attempts"
    n=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
    echo $n > "$count_file"
    echo "rank setup: DGXNGPU=$DGXNGPU SEED=$SEED DATADIR=$DATADIR MODEL=$MODEL"
    mllog() { echo ":::MLLOG {\\"namespace\\": \\"\\", \\"time_ms\\": $1, \\"event_type\\": \\"$2\\", \\"key\\": \\"$3\\", \\"value\\": $4, \\"metadata\\": $5}"; }
    mllog 1000 POINT_IN_TIME seed $SEED '{}'
    mllog 2000 INTERVAL_START run_start null '{}'
    if [[ -n "${FAIL_BEFORE_STEP:-}" ]]; then echo "ValueError: bad setting on attempt $n" >&2; exit 2; fi
    mllog 3000 POINT_IN_TIME train_loss 2.0 '{"samples_count": 32}'
    if (( n <= ${FAIL_ATTEMPTS:-0} )); then echo "RuntimeError: boom on attempt $n" >&2; exit 3; fi
    if (( n <= ${HANG_ATTEMPTS:-0} )); then sleep 300; fi
    if [[ -n "${WAIT_FOR_USR1:-}" ]] && (( n == 1 )); then
        trap 'echo "tiny: SIGUSR1, saving"; echo "tiny segment: {\\"status\\": \\"resume\\", \\"from_step\\": 0, \\"to_step\\": 1}"; exit 0' USR1
        for i in $(seq 1 600); do sleep 0.1; done
        exit 1
    fi
    # A rank in a session of its own, as torch's elastic launcher starts them.
    if [[ -n "${RANK_IN_NEW_SESSION:-}" ]]; then setsid bash -c 'exec -a fake-rank sleep 300' & fi
    # The results folder fills up while the run writes its log.
    if [[ -n "${FILL:-}" ]]; then
        cat /dev/zero > "$LOGDIR/../filler" 2>/dev/null || true
        for i in $(seq 1 2000); do echo "line $i of a log that no longer fits"; done
    fi
    if [[ -n "${SLEEP:-}" ]]; then sleep "$SLEEP"; fi
    [[ -n "${NO_STOP:-}" ]] && exit 0
    mllog 62000 POINT_IN_TIME eval_accuracy 0.5 '{"samples_count": 64}'
    mllog 62000 INTERVAL_END run_stop null "{\\"status\\": \\"${STATUS:-success}\\", \\"samples_count\\": 64}"
""")

CONFIG = textwrap.dedent("""\
    export DGXNNODES=1
    export DGXNGPU=1
    export WALLTIME_RUNANDTIME=${WALLTIME_RUNANDTIME:-1}
    export WALLTIME=$((${WALLTIME_RUNANDTIME} + 1))
    export MINIBS=4 TP=1 PP=1 CP=1
""")


@pytest.fixture
def tree(tmp_path):
    """A workflow root with a tiny implementation `tiny` and a local system."""
    shutil.copytree(REPO / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    impl = tmp_path / "implementations" / "tiny"
    impl.mkdir(parents=True)
    (impl / "run_and_time.sh").write_text(RUN_AND_TIME)
    (impl / "config_CPU_1x1x4xtp1pp1cp1.sh").write_text(CONFIG)
    (impl / "run.sub").write_text("#!/bin/bash\n")
    for sub in ("benchmarks", "systems"):
        (tmp_path / "config" / sub).mkdir(parents=True)
    write_benchmark(tmp_path)
    (tmp_path / "config" / "systems" / "here.yaml").write_text(yaml.safe_dump(
        {"name": "here", "scheduler": "local", "nodes": 1, "gpus_per_node": 1}))
    (tmp_path / "config" / "systems" / "cluster.yaml").write_text(yaml.safe_dump(
        {"name": "cluster", "scheduler": "slurm", "nodes": 4, "gpus_per_node": 1, "partition": "batch",
         "account": "proj", "exclude_nodes": ["bad1"]}))
    return tmp_path


def write_benchmark(root: Path, **changes) -> None:
    data = {"name": "tiny", "implementation": {"path": "implementations/tiny"}, "required_runs": 2,
            "target": {"metric": "eval_accuracy", "value": 0.9, "direction": "below"}, "retries": 0,
            "run_env": {"DATADIR": "{dataset}", "MODEL": "{checkpoint}/weights"}, **changes}
    (root / "config" / "benchmarks" / "tiny.yaml").write_text(yaml.safe_dump(data))


def settings(root: Path, system: str = "here") -> config.Settings:
    return config.load({"benchmarks": ["tiny"], "system": system}, root)


def test_plan_composes_the_run_sub_environment(tree):
    plan = mlperf.plan_seed(settings(tree), "tiny", 2)
    assert (plan.nodes, plan.gpus_per_node, plan.walltime_minutes) == (1, 1, 2)
    assert plan.dgxsystem == "CPU_1x1x4xtp1pp1cp1"
    assert plan.env["SEED"] == "2" and plan.env["NEXP"] == "1" and plan.env["DGXSYSTEM"] == "CPU_1x1x4xtp1pp1cp1"
    assert plan.env["DATADIR"] == str(tree / "resources" / "tiny" / "data")
    assert plan.env["MODEL"] == str(tree / "resources" / "tiny" / "checkpoint" / "weights")
    assert plan.env["MINIBS"] == "4"
    assert "local run_and_time.sh" in plan.describe()
    with pytest.raises(config.ConfigError, match="seed 7 is not a seed of tiny"):
        mlperf.plan_seed(settings(tree), "tiny", 7)


def test_slurm_plan_shows_the_sbatch_line(tree):
    plan = mlperf.plan_seed(settings(tree, "cluster"), "tiny", 1)
    line = plan.describe()
    assert line.startswith("1 node x 1 GPUs (CPU_1x1x4xtp1pp1cp1), wall-time 2 min: sbatch ")
    for part in ("--nodes=1", "--time=2", "--partition=batch", "--account=proj", "--exclude=bad1",
                 str(tree / "implementations" / "tiny" / "run.sub")):
        assert part in line
    assert plan.local_threads == 1


def test_a_user_path_recorded_by_a_stage_is_where_runs_read(tree):
    folder = paths.stage_folder(tree, "tiny", "checkpoint")
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"location": "/members/only/ckpt"}))
    assert mlperf.plan_seed(settings(tree), "tiny", 1).env["MODEL"] == "/members/only/ckpt/weights"


def seed_paths(root: Path, seed: int) -> tuple[Path, Path]:
    seed_dir = root / "results" / "tiny" / f"seed_{seed}"
    return seed_dir / "mllog.txt", seed_dir / "run.log"


@pytest.mark.slow
def test_local_seed_runs_through_submitit_and_writes_only_mllog(tree):
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    text = out.read_text()
    assert ":::MLLOG" in text and "run_stop" in text and "rank setup" not in text
    assert "rank setup: DGXNGPU=1 SEED=1" in log.read_text()
    job = json.loads((out.parent / "job.json").read_text())
    assert job["scheduler"] == "local" and job["walltime_minutes"] == 2
    assert not (out.parent / "failure.json").exists()


@pytest.mark.slow
def test_failed_attempt_is_retried_and_its_reason_kept_until_success(tree, monkeypatch):
    write_benchmark(tree, retries=1)
    monkeypatch.setenv("FAIL_ATTEMPTS", "1")
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert (out.parent / "attempts").read_text().strip() == "2"
    assert out.exists() and not (out.parent / "failure.json").exists()


@pytest.mark.slow
def test_a_failure_before_the_first_step_is_not_retried(tree, monkeypatch):
    write_benchmark(tree, retries=3)
    monkeypatch.setenv("FAIL_BEFORE_STEP", "1")
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="before its first new step"):
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert (out.parent / "attempts").read_text().strip() == "1"
    failure = json.loads((out.parent / "failure.json").read_text())
    assert failure["class"] == "failed_before_first_step" and failure["attempts"] == ["failed_before_first_step"]
    assert failure["error_lines"][-1] == "ValueError: bad setting on attempt 1" and failure["exit_code"] == 2
    attempt = json.loads((out.parent / "attempt_1" / "attempt.json").read_text())
    assert attempt["class"] == "failed_before_first_step"


@pytest.mark.slow
def test_the_same_error_twice_in_a_row_ends_the_seed_within_its_budget(tree, monkeypatch):
    write_benchmark(tree, retries=5)
    monkeypatch.setenv("FAIL_ATTEMPTS", "9")
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="the same error twice in a row"):
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert (out.parent / "attempts").read_text().strip() == "2"  # not 6: the error will not heal
    failure = json.loads((out.parent / "failure.json").read_text())
    assert failure["attempts"] == ["failed_mid_run", "failed_mid_run"] and failure["signature"]


@pytest.mark.slow
def test_a_quiet_attempt_is_stopped_as_hung_and_the_seed_runs_again(tree, monkeypatch):
    write_benchmark(tree, retries=1, hang={"floor_seconds": 2, "multiple": 5, "startup_seconds": 4})
    monkeypatch.setenv("HANG_ATTEMPTS", "1")  # the first attempt logs one step, then hangs
    out, log = seed_paths(tree, 1)
    started = time.monotonic()
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert time.monotonic() - started < 60  # not the stub's 300 s sleep: the watch stopped it
    assert (out.parent / "attempts").read_text().strip() == "2" and out.exists()
    first = json.loads((out.parent / "attempt_1" / "attempt.json").read_text())
    assert first["class"] == "hung" and first["state"] == "HUNG"
    assert json.loads((out.parent / "attempt_2" / "attempt.json").read_text())["class"] == "finished"
    assert not (out.parent / "failure.json").exists()
    from mlrepro import status
    (out.parent / "run.json").write_text(json.dumps({"seed": 1, "minutes": 0.1, "status": "success", "converged": True}))
    assert "2 attempts: hung, finished" in status.format_table([status.seed_status(1, out.parent)])


@pytest.mark.slow
def test_the_save_signal_reaches_the_run_before_its_limit(tree, monkeypatch):
    # A 60 s job limit with the signal 57 s before it: SIGUSR1 after about 3 s, long before the margin.
    write_benchmark(tree, segments={"job_seconds": 60, "margin_seconds": 0, "save_signal_seconds": 57})
    monkeypatch.setenv("WAIT_FOR_USR1", "1")
    out, log = seed_paths(tree, 1)
    started = time.monotonic()
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert time.monotonic() - started < 45
    assert "tiny: SIGUSR1, saving" in (out.parent / "attempt_1" / "run.log").read_text()
    chain = json.loads((out.parent / "segments.json").read_text())["segments"]
    assert [s["class"] for s in chain] == ["saved_at_limit", "finished"]


@pytest.mark.slow
def test_failure_leaves_logs_and_reason_but_no_mllog(tree, monkeypatch):
    monkeypatch.setenv("FAIL_ATTEMPTS", "5")
    out, log = seed_paths(tree, 2)
    with pytest.raises(launch.SeedFailed, match="exited with 3"):
        stages.train_seed(settings(tree), "tiny", 2, out, log)
    failure = json.loads((out.parent / "failure.json").read_text())
    assert failure["state"] == "FAILED" and failure["exit_code"] == 3
    assert "boom on attempt 1" in log.read_text()
    assert not out.exists()


@pytest.mark.slow
def test_a_log_without_run_stop_is_not_a_result(tree, monkeypatch):
    monkeypatch.setenv("NO_STOP", "1")
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="no run_stop"):
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert json.loads((out.parent / "failure.json").read_text())["state"] == "INCOMPLETE_LOG"
    assert not out.exists()


@pytest.mark.slow
def test_aborted_run_counts_or_reruns_as_the_benchmark_says(tree, monkeypatch):
    monkeypatch.setenv("STATUS", "aborted")
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)  # not_converged: count (MLPerf)
    assert '"status": "aborted"' in out.read_text()
    write_benchmark(tree, not_converged="rerun")
    out2, log2 = seed_paths(tree, 2)
    with pytest.raises(launch.SeedFailed, match="aborted"):
        stages.train_seed(settings(tree), "tiny", 2, out2, log2)
    assert json.loads((out2.parent / "failure.json").read_text())["state"] == "ABORTED"


@pytest.mark.slow
def test_wall_time_is_enforced(tree, monkeypatch):
    # WALLTIME = WALLTIME_RUNANDTIME + 1 minutes; a run that sleeps longer is stopped.
    monkeypatch.setenv("SLEEP", "600")
    (tree / "implementations" / "tiny" / "config_CPU_1x1x4xtp1pp1cp1.sh").write_text(
        CONFIG.replace("export WALLTIME=$((${WALLTIME_RUNANDTIME} + 1))", "export WALLTIME=1"))
    mlperf._pick_config.cache_clear()
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="timeout"):
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert json.loads((out.parent / "failure.json").read_text())["state"] == "TIMEOUT"
    assert not out.exists()


def test_dataset_stage_from_a_hub_source_with_a_token_and_a_manifest(tree, monkeypatch):
    from fixtures.http_server import LocalHTTPServer

    token = "hf_stage_test_token_0123456789abcdef"
    files = {"train.npy": b"t" * 3000, "validation.npy": b"v" * 500, "README.md": b"readme"}
    (tree / "implementations" / "tiny" / "expected-mounts.csv").write_text(
        "key,type,relative_path,num_files,num_bytes\n"
        "DATADIR,file,train.npy,1,3000\nDATADIR,file,validation.npy,1,500\nDATADIR,dir,.,2,3500\n")
    write_benchmark(tree, dataset={"needs_token": True, "sources": [
        {"hub": {"repo_id": "org/gov", "repo_type": "dataset", "allow_patterns": ["*.npy"]},
         "expected_mounts": "DATADIR"}]})
    out = tree / "resources" / "tiny" / "data" / "manifest.json"
    log = tree / "logs" / "dataset.log"
    monkeypatch.chdir(tree)
    with LocalHTTPServer(require_token=token) as hub:
        hub.add_hub_repo("org/gov", files, repo_type="dataset")
        monkeypatch.setenv("HF_ENDPOINT", hub.url(""))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        from mlrepro.data import checks, manifest

        with pytest.raises(checks.MissingTokenError, match="HF_TOKEN"):
            stages_data.dataset(settings(tree), "tiny", out, log)
        assert not hub.requests, "a missing token must fail before any request"
        monkeypatch.setenv("HF_TOKEN", token)
        stages_data.dataset(settings(tree), "tiny", out, log)
    manifest = json.loads(out.read_text())
    assert sorted(f["path"] for f in manifest["files"]) == ["train.npy", "validation.npy"]
    assert (out.parent / "train.npy").read_bytes() == files["train.npy"]
    for path in [*tree.rglob("*.json"), *tree.rglob("*.log")]:
        assert token not in path.read_text(errors="replace"), f"token leaked into {path}"


# ---------------------------------------------------------------- secrets, processes, inputs, full disks

SECRETS = {"HF_TOKEN": "hf_launch_secret_0123456789", "WANDB_API_KEY": "wandb-key-with space",
           "DB_PASSWORD": "pa'ss\"word", "GH_PAT": "p4"}


def all_bytes(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_secrets_reach_the_run_by_name_and_are_never_written(tree, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    (tree / "implementations" / "tiny" / "run_and_time.sh").write_text(
        RUN_AND_TIME + 'echo "run sees token ${HF_TOKEN} and ${DB_PASSWORD}"\n')
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    # The run had the secret (redacted in its log), and no file holds any secret in any form.
    assert "run sees token *** and ***" in log.read_text()
    pickles = list(out.parent.glob("attempt_1/.submitit/*_submitted.pkl"))
    assert pickles, "submitit's pickle is where the secrets used to leak"
    for path, data in all_bytes(tree / "results").items():
        for value in SECRETS.values():
            if len(value) >= 4:
                assert value.encode() not in data, f"{value!r} written to {path}"


def seed_marker(tree: Path, seed: int) -> str:
    from mlrepro.util import proctree

    return proctree.seed_marker(tree / "results" / "tiny" / f"seed_{seed}")


def test_ranks_in_their_own_session_die_with_the_run(tree, monkeypatch):
    from mlrepro.util import proctree

    monkeypatch.setenv("RANK_IN_NEW_SESSION", "1")
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert out.exists()
    assert proctree.find(seed_marker(tree, 1)) == []


def test_a_rank_unseen_when_the_run_ends_is_killed_and_the_run_returns(tmp_path):
    """run_and_time.sh exits while a rank, in a session of its own, cannot be seen yet: a process
    between two images (execve) shows an empty environment, so one look for the seed's marker can
    miss it, and the rank then held the log's pipe open until the wall-time (CI: this file's rank
    test, under load). Here the rank hides its marker for a second, then takes it back. The run
    kills until the pipe closes: it returns within seconds and leaves nothing behind."""
    from mlrepro.util import proctree

    impl = tmp_path / "impl"
    impl.mkdir()
    (impl / "run_and_time.sh").write_text(
        f"setsid env -u {proctree.MARKER} bash -c 'sleep 1; exec env {proctree.MARKER}=\"$0\" "
        f"bash -c \"exec -a fake-rank sleep 300\"' \"${proctree.MARKER}\" &\necho run ended\n")
    marker = f"{tmp_path.name}-unseen-rank"
    code = ("import sys; from mlrepro.launch import local; "
            f"sys.exit(local.run_and_time({str(impl)!r}, {{}}, {str(tmp_path / 'run.log')!r}, {str(tmp_path / 'pid')!r}))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, proctree.MARKER: marker},
                              capture_output=True, text=True, timeout=30)
    finally:
        left = proctree.kill(marker)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert left == [] and "run ended" in (tmp_path / "run.log").read_text()


def _owner(tree: Path, seed: int, **env) -> subprocess.Popen:
    code = (f"from pathlib import Path; from mlrepro import config; from mlrepro.stages import train as stages; "
            f"s = config.load({{'benchmarks': ['tiny'], 'system': 'here'}}, Path({str(tree)!r})); "
            f"d = s.root / 'results/tiny/seed_{seed}'; "
            f"stages.train_seed(s, 'tiny', {seed}, d / 'mllog.txt', d / 'run.log')")
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _rank_running(marker: str) -> bool:
    from mlrepro.util import proctree

    return any("fake-rank" in p.command for p in proctree.find(marker))


def test_an_earlier_attempts_watchdog_leaves_the_next_attempt_alone(tmp_path):
    """A workflow SIGKILLed and rerun at once: the killed attempt's watchdog can still be at work when
    the rerun's attempt starts (CI: the rerun's attempt 2 died, 'launcher failed'). It stops only its
    own attempt's processes; the seed's marker still finds every attempt's."""
    from mlrepro.util import proctree

    seed = proctree.seed_marker(tmp_path / "seed_1")
    first, second = proctree.attempt_marker(seed, 1), proctree.attempt_marker(seed, 2)
    owner = subprocess.Popen(["sleep", "60"])
    old, new = (subprocess.Popen(["sleep", "60"], env={**os.environ, proctree.MARKER: m}, start_new_session=True)
                for m in (first, second))
    try:
        assert {p.pid for p in proctree.find(seed)} == {old.pid, new.pid}
        assert [p.pid for p in proctree.find(second)] == [new.pid]
        assert proctree.find(proctree.attempt_marker(seed, 20)) == []  # attempt 2 is not attempt 20's prefix
        watchdog = proctree.start_watchdog(first, owner=owner.pid)
        owner.kill()
        owner.wait()
        assert watchdog.wait(timeout=30) == 0
        assert old.wait(timeout=10) == -signal.SIGKILL
        assert new.poll() is None
    finally:
        for proc in (owner, old, new):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGKILL", "SIGINT"])
def test_killed_or_interrupted_workflow_leaves_no_rank_and_the_rerun_one_run(tree, signum):
    from mlrepro.util import proctree

    marker = seed_marker(tree, 1)
    owner = _owner(tree, 1, RANK_IN_NEW_SESSION="1", SLEEP="300")
    try:
        assert _wait_for(lambda: _rank_running(marker), 60), owner.stderr.read1().decode() if owner.poll() else ""
        os.killpg(owner.pid, getattr(signal, signum))
        owner.wait(timeout=30)
        # SIGINT: the seed stops its processes itself; SIGKILL: its watchdog does.
        assert _wait_for(lambda: proctree.find(marker) == [], 10), proctree.find(marker)
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
    out, log = seed_paths(tree, 1)
    assert not out.exists()
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    second = (out.parent / "attempt_2" / "run.log").read_text()
    assert second.count("run_start") == 1 and second.count("run_stop") == 1
    assert log.read_text() == second and out.read_text().count("run_start") == 1
    assert (out.parent / "attempt_1" / "run.log").exists()


def _changed_manifest_tree(tree: Path) -> tuple[Path, Path]:
    import numpy as np

    from mlrepro.data import manifest

    folder = tree / "resources" / "tiny" / "data"
    folder.mkdir(parents=True)
    np.save(folder / "train.npy", np.arange(100))
    np.save(folder / "validation.npy", np.arange(10))
    manifest.write_manifest(folder, folder / "manifest.json")
    return folder, folder / "validation.npy"


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("change", ["same_size_array", "other_size_array", "pickle_payload", "missing"])
def test_a_changed_input_fails_the_seed_naming_the_file(tree, change):
    import numpy as np

    folder, target = _changed_manifest_tree(tree)
    ran = tree / "payload-ran"
    if change == "same_size_array":
        np.save(target, np.arange(10)[::-1].copy())
    elif change == "other_size_array":
        np.save(target, np.arange(11))
    elif change == "pickle_payload":
        array = np.empty(1, dtype=object)
        array[0] = _Payload(ran)
        np.save(target, array, allow_pickle=True)
    else:
        target.unlink()
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="validation.npy") as failed:
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert not failed.value.retry
    failure = json.loads((out.parent / "failure.json").read_text())
    assert failure["state"] == "INPUT_CHANGED" and "validation.npy" in failure["reason"]
    assert "train.npy" not in failure["reason"]
    assert not list(out.parent.glob("attempt_*")), "no run may start on changed data"
    assert not ran.exists()


def test_verification_reads_an_unchanged_file_once(tree, monkeypatch):
    from mlrepro.data import manifest

    folder, _ = _changed_manifest_tree(tree)
    assert manifest.verify_manifest(folder / "manifest.json") == []
    reads = []
    monkeypatch.setattr(manifest, "xxh3_file", lambda p: reads.append(p) or "0")
    assert manifest.verify_manifest(folder / "manifest.json") == []
    assert reads == []
    (folder / "train.npy").write_bytes((folder / "train.npy").read_bytes())  # rewritten in place: read again
    assert manifest.verify_manifest(folder / "manifest.json") == [f"{folder / 'train.npy'}: content (xxh3_128) differs "
                                                              "from the manifest: it changed"]
    assert reads == [folder / "train.npy"]


@pytest.fixture
def small_fs(tree):
    """The seed's folder on a tmpfs of its own (to fill it up, or make it read-only)."""
    seed_dir = tree / "results" / "tiny" / "seed_1"
    seed_dir.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(seed_dir)],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        # chmod does not stop root, and a full disk cannot be made without a filesystem of its own.
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {proc.stderr.strip()}")
    yield seed_dir
    subprocess.run(["umount", "-l", str(seed_dir)], capture_output=True, timeout=30)


@pytest.mark.slow
def test_full_results_folder_gives_a_failed_seed_with_reason_and_the_rerun_recovers(tree, small_fs, monkeypatch):
    monkeypatch.setenv("FILL", "1")
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="No space left on device") as failed:
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert not failed.value.retry
    failure = json.loads((small_fs / "failure.json").read_text())
    assert failure["state"] == "IO_ERROR" and "No space left on device" in failure["reason"]
    (small_fs / "filler").unlink()
    monkeypatch.delenv("FILL")
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert out.exists() and not (small_fs / "failure.json").exists()


@pytest.mark.slow
def test_read_only_results_folder_gives_a_failed_seed_with_reason_and_the_rerun_recovers(tree, small_fs):
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True, timeout=30)
    out, log = seed_paths(tree, 1)
    with pytest.raises(launch.SeedFailed, match="Read-only file system"):
        stages.train_seed(settings(tree), "tiny", 1, out, log)
    subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True, timeout=30)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert out.exists()


@pytest.mark.slow
def test_a_finished_attempt_left_by_a_killed_workflow_is_kept_not_retrained(tree):
    """Issue 26 item 6: the workflow died after the seed's run finished but before Snakemake recorded
    its output; the rerun of the incomplete job (its output deleted first) trained the seed again as
    attempt 2 and threw the finished run away."""
    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    finished = out.read_text()
    out.unlink()  # what Snakemake does to an incomplete job's output before running it again
    log.unlink()
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert (out.parent / "attempts").read_text().strip() == "1", "the finished seed was trained again"
    assert sorted(p.name for p in out.parent.glob("attempt_*")) == ["attempt_1"]
    assert out.read_text() == finished and log.read_text() == (out.parent / "attempt_1" / "run.log").read_text()
    assert not (out.parent / "failure.json").exists()


@pytest.mark.slow
def test_killing_snakemakes_process_alone_stops_the_stage_and_every_rank(tree):
    """Issue 26 item 6: SIGKILL of snakemake's own process (not its group) left the stage, its
    watchdog, submitit, run_and_time and the ranks running: the watchdog watched the stage. Here the
    "snakemake" is a process that starts the run's guard as the Snakefile does, then a stage."""
    import time

    from mlrepro.launch import guard
    from mlrepro.util import proctree

    marker = seed_marker(tree, 1)
    (tree / ".snakemake" / "locks").mkdir(parents=True)
    (tree / ".snakemake" / "locks" / "0.input.lock").write_text("")
    stage = ("from pathlib import Path; from mlrepro import config; from mlrepro.stages import train as stages; "
             f"s = config.load({{'benchmarks': ['tiny'], 'system': 'here'}}, Path({str(tree)!r})); "
             "d = s.root / 'results/tiny/seed_1'; stages.train_seed(s, 'tiny', 1, d / 'mllog.txt', d / 'run.log')")
    code = (f"import subprocess, sys, time; from mlrepro.launch import guard; guard.guard_workflow({str(tree)!r}); "
            f"subprocess.Popen([sys.executable, '-c', {stage!r}]); time.sleep(600)")
    env = {k: v for k, v in os.environ.items() if k != guard.RUN_MARKER}
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=tree, start_new_session=True,
                             env={**env, "RANK_IN_NEW_SESSION": "1", "SLEEP": "300"})
    try:
        assert _wait_for(lambda: _rank_running(marker), 60)
        os.kill(owner.pid, signal.SIGKILL)  # the process only: its stage is left orphaned
        owner.wait()
        killed = time.monotonic()
        assert _wait_for(lambda: proctree.find(marker) == [], 10), proctree.find(marker)
        assert time.monotonic() - killed < 5
        assert _wait_for(lambda: _stage_processes(tree) == [], 5), _stage_processes(tree)
        assert _wait_for(lambda: not (tree / ".snakemake" / "locks" / "0.input.lock").exists(), 10), \
            "the killed run's lock was left for --unlock"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pid in _stage_processes(tree):
            os.kill(pid, signal.SIGKILL)
        proctree.kill(marker)


def _stage_processes(tree: Path) -> list[int]:
    """Live processes that run a stage of `tree` (their command line names it)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if b"train_seed" in Path(entry.path, "cmdline").read_bytes() and str(tree).encode() in \
                        Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_a_seed_log_truncated_after_it_finished_is_named_with_its_rerun_which_takes_the_run_back(tree):
    """Issue 26 item 8: a finished seed whose mllog.txt was later truncated was scored as a failed run
    and never retrained; the score stayed valid on the others and nothing said why."""
    from mlrepro import status
    from mlrepro.stages import score as stages_score

    out, log = seed_paths(tree, 1)
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    whole = out.read_text()
    run_json = out.parent / "run.json"
    stages_score.score_seed(settings(tree), "tiny", 1, out, run_json)
    assert "changed_after_finish" not in json.loads(run_json.read_text())
    out.write_text(whole[: len(whole) // 2])
    stages_score.score_seed(settings(tree), "tiny", 1, out, run_json)
    run = json.loads(run_json.read_text())
    changed = run["changed_after_finish"]
    assert "seed_1/mllog.txt was truncated after the seed finished" in changed["reason"]
    rerun = "results/tiny/score.json --forcerun results/tiny/seed_1/mllog.txt --config system=here"
    assert changed["rerun"] == f"snakemake --profile profiles/local {rerun}"
    assert run["counted"] is False and any("truncated" in r for r in run["reasons"])
    row = status.seed_status(1, out.parent)
    assert row.state == status.FAILED and "truncated" in row.reason and rerun in row.reason
    # The rerun: Snakemake deletes the forced job's output and runs the seed's job, which takes the
    # finished run back from its attempt's log; nothing is trained again.
    out.unlink()
    stages.train_seed(settings(tree), "tiny", 1, out, log)
    assert out.read_text() == whole and (out.parent / "attempts").read_text().strip() == "1"
    stages_score.score_seed(settings(tree), "tiny", 1, out, run_json)
    assert "changed_after_finish" not in json.loads(run_json.read_text())
    assert status.seed_status(1, out.parent).state == status.DONE


def test_a_rerun_releases_a_dead_runs_lock_and_leaves_a_live_runs(tmp_path):
    """CI: the plain rerun right after a kill of snakemake's process was refused ("Directory cannot be
    locked") while the dead run's guard was still asking Slurm which jobs to cancel."""
    from mlrepro.launch import guard

    lock = tmp_path / ".snakemake" / "locks" / "0.output.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(str(tmp_path / "results"))
    # A live snakemake in the folder (a program of that name working there): its lock is kept.
    program = tmp_path / "bin" / "snakemake"
    program.parent.mkdir()
    program.symlink_to(sys.executable)
    live = subprocess.Popen([str(program), "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        assert guard.snakemake_running_in(tmp_path.resolve()) == [live.pid]
        guard.release_stale_lock(tmp_path)
        assert lock.exists()
    finally:
        live.kill()
        live.wait()
    guard.release_stale_lock(tmp_path)
    assert not lock.exists()
