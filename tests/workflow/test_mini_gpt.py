"""mini_gpt through the real snakemake: from the corpus stages to a score, chained time-limited jobs
that resume to the same loss as an uninterrupted run, kills that lose at most one checkpoint
interval, and a chained seed on the local Slurm cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from mlrepro.scoring import mllog, tfevents
from mlrepro.slurm import client as slurm
from mlrepro.corpus import minicorpus
from mlrepro.formats import checkpoints
from mlrepro.pretrain import progress
from mlrepro.util import proctree
from workspace import make_workspace, planned_jobs, run_snakemake, snakemake_cmd, wait_for

pytestmark = pytest.mark.slow

LOCAL = ("--profile", "profiles/local")  # mini_gpt names its corpus: no --config corpora=... needed
CKPT_EVERY = 20  # config_common.sh


def evals(mllog_path: Path) -> list[tuple[int, float]]:
    parsed = mllog.parse_text(mllog_path.read_text(), source=str(mllog_path))
    return [(e.metadata["samples_count"], e.value) for e in parsed.all("eval_accuracy")]


def seed_1_alone(ws: Path) -> dict:
    """mini_gpt's benchmark file as the workspace has it, with seed 1 alone."""
    spec = yaml.safe_load((ws / "config/benchmarks/mini_gpt.yaml").read_text())
    spec.update(seeds=[1], required_runs=1)
    return spec


def variant(ws: Path, name: str, job_seconds: float, margin: float, system_line: str | None = None, **keys) -> None:
    """config/benchmarks/<name>.yaml: mini_gpt's seed 1 alone, under a job limit (and other benchmark `keys`)."""
    spec = seed_1_alone(ws)
    spec.update(name=name, **keys)
    # The trainer logs the benchmark it runs as; a log of another benchmark is not scored.
    spec["env"] = {**(spec.get("env") or {}), "SUBMISSION_BENCHMARK": name}
    spec["segments"].update(job_seconds=job_seconds, margin_seconds=margin)
    (ws / f"config/benchmarks/{name}.yaml").write_text(yaml.safe_dump(spec))
    if system_line:
        system = ws / "config/systems/local-slurm.yaml"
        system.write_text(system.read_text().replace("implementation_configs:", f"implementation_configs:\n  {system_line}"))


def job_seconds(ws: Path, share: float, margin: float) -> float:
    """A job limit whose training time is `share` of the uninterrupted seed 1's: segment counts then
    hold on a machine of any speed (a fixed limit gave CI's faster machine two segments where three
    were asserted)."""
    trained = json.loads((ws / "results/mini_gpt/seed_1/run.json").read_text())["minutes"] * 60
    return round(max(2.0, share * trained) + margin, 1)


def corpus_workspace(tmp: Path, target: str, one_seed: bool = False) -> tuple[Path, subprocess.CompletedProcess, float]:
    """A workspace with the miniature corpus served on localhost, and `target` made in it; `one_seed`:
    mini_gpt's seed 1 alone (its three seeds from nothing are the README test's real run)."""
    ws = make_workspace(tmp / "ws")
    if one_seed:
        (ws / "config/benchmarks/mini_gpt.yaml").write_text(yaml.safe_dump(seed_1_alone(ws)))
    server = minicorpus.serve(minicorpus.make_mini_corpus(tmp / "srv"))
    try:
        config = ws / "config/corpora/mini_corpus.yaml"
        config.write_text(config.read_text().replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
        started = time.monotonic()
        proc = run_snakemake(ws, *LOCAL, "--", target, timeout=900)
        return ws, proc, time.monotonic() - started
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """One `snakemake results/mini_gpt/score.json` from nothing: corpus stages, seed 1, score."""
    ws, proc, seconds = corpus_workspace(tmp_path_factory.mktemp("mini_gpt"), "results/mini_gpt/score.json",
                                         one_seed=True)
    return {"ws": ws, "proc": proc, "seconds": seconds}


def test_end_to_end_locally_from_the_corpus_stages(scored):
    ws = scored["ws"]
    log = scored["proc"].stdout + scored["proc"].stderr
    jobs = planned_jobs(log)
    assert jobs["corpus_preprocess"] == 1 and jobs["corpus_blend"] == 1 and jobs["train_seed"] == 1, jobs
    score = json.loads((ws / "results/mini_gpt/score.json").read_text())
    runs = [json.loads((ws / "results/mini_gpt/seed_1/run.json").read_text())]
    times = [r["minutes"] * 60 for r in runs]
    print(f"mini_gpt end to end: {scored['seconds']:.0f} s; seeds {[round(t, 1) for t in times]} s; "
          f"samples {[r['samples_to_converge'] for r in runs]}")
    assert all(r["converged"] for r in runs) and score
    # Calibrated for 20-60 s a seed on an idle 2-core machine; a shared one is slower, so the bound is loose.
    assert all(5 <= t <= 300 for t in times)
    # Each seed trained from scratch: its first evaluation is far above the target, its last at it.
    for r in runs:
        assert r["evals"][0][1] > 5 and r["evals"][-1][1] <= 3.495
        assert [s["status"] for s in r["segments"]] == ["success"]
    assert (ws / "results/mini_gpt/report.html").is_file()
    assert json.loads((ws / "results/mini_gpt/verdict.json").read_text())
    # Each scored seed's curve as TensorBoard event files, read back through tensorboard's reader as run.json has it
    for r in runs:
        scored = tfevents.read_scalars(ws / f"results/tensorboard/mini_gpt/seed_{r['seed']}")
        assert scored.skipped == [] and scored.series == {"eval_accuracy vs samples": [tuple(e) for e in r["evals"]]}
    # Checkpoints kept by policy (config_common.sh): the best two by val_loss plus the last, never more.
    kept = checkpoints.listing(ws / "results/mini_gpt/seed_1/checkpoints")
    assert 2 <= len(kept) <= 3


def test_a_seed_longer_than_its_job_limit_runs_as_chained_jobs_to_the_same_loss(scored):
    ws = scored["ws"]
    # A fifth of the seed's training a segment: about five segments, three even if this run is twice as
    # fast as seed 1's, whose time sets the limit (CI's machine has run the same seed 1.7 times faster).
    variant(ws, "mini_gpt_chain", job_seconds=job_seconds(ws, 0.2, margin=2), margin=2)
    started = time.monotonic()
    run_snakemake(ws, *LOCAL, "--", "results/mini_gpt_chain/seed_1/run.json", timeout=600)
    seed = ws / "results/mini_gpt_chain/seed_1"
    run = json.loads((seed / "run.json").read_text())
    chain = run["segments"]
    print(f"chained: {len(chain)} segments in {time.monotonic() - started:.0f} s: "
          + "; ".join(f"{s['from_step']}->{s['to_step']} {s['status']} train {s['train_s']} s wall {s['wall_s']} s"
                      for s in chain) + f"; time to train {run['minutes'] * 60:.1f} s")
    assert len(chain) >= 3 and [s["status"] for s in chain[:-1]] == ["resume"] * (len(chain) - 1)
    assert chain[-1]["status"] == "success"
    assert all(a["to_step"] == b["from_step"] for a, b in zip(chain, chain[1:]))  # each resumed where it stopped
    assert len(list(seed.glob("attempt_*"))) == len(chain)
    # Time to train is the sum of the segments' training time, not the wall-clock of the chain.
    assert run["minutes"] * 60 == pytest.approx(sum(s["train_s"] for s in chain), rel=0.05, abs=1.0)
    uninterrupted = evals(ws / "results/mini_gpt/seed_1/mllog.txt")
    chained = evals(seed / "mllog.txt")
    assert [n for n, _ in chained] == [n for n, _ in uninterrupted]
    assert [v for _, v in chained] == pytest.approx([v for _, v in uninterrupted], abs=1e-6)
    # A workflow that dies after the last segment, before the seed's log is written: the rerun keeps
    # the finished run (its log and segments), trains nothing and adds no job.
    kept = (seed / "mllog.txt").read_text()
    (seed / "mllog.txt").unlink()
    (seed / "run.json").unlink()
    run_snakemake(ws, *LOCAL, "--", "results/mini_gpt_chain/seed_1/run.json", timeout=600)
    assert json.loads((seed / "run.json").read_text())["segments"] == chain
    assert len(list(seed.glob("attempt_*"))) == len(chain)
    assert (seed / "mllog.txt").read_text() == kept


def test_kills_mid_segment_and_between_segments_lose_at_most_one_checkpoint_interval(scored):
    ws = scored["ws"]
    # Half the seed's training a segment: the first passes step 30 (the kill), the second, resumed from
    # step 20 or 40, stops short of convergence at seed 1's speed, so the workflow is killed between segments.
    variant(ws, "mini_gpt_kill", job_seconds=job_seconds(ws, 0.5, margin=2), margin=2)
    seed = ws / "results/mini_gpt_kill/seed_1"
    target = "results/mini_gpt_kill/seed_1/mllog.txt"
    first = subprocess.Popen(snakemake_cmd(*LOCAL, "--", target), cwd=ws, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def mid_segment() -> dict | None:
        """The running segment's progress once it is past a checkpoint and half-way to the next."""
        live, saved = progress.live(seed) or {}, checkpoints.latest(seed / "checkpoints")
        pid = seed / f"attempt_{live.get('segment')}/run.pid"
        return (live if saved and saved.step >= 20 and live.get("step", 0) % CKPT_EVERY == 10 and pid.exists()
                and Path(f"/proc/{pid.read_text().strip()}").exists() else None)

    try:
        # Mid-segment: SIGKILL a job's run_and_time.sh (its ranks go with it) once it is past a checkpoint;
        # the first job's at the speed of seed 1's run, a later one's on a machine twice as slow.
        for _ in range(3):
            live = wait_for(mid_segment, 180, "a segment mid-way", first)
            try:
                os.kill(int((seed / f"attempt_{live['segment']}/run.pid").read_text()), signal.SIGKILL)
                break
            except ProcessLookupError:  # it reached its limit and ended between the look and the kill
                continue
        else:
            pytest.fail("three segments ended between the look and the kill")
        killed, at_kill = live["segment"], live["step"]
        # Between segments: the workflow is killed as soon as the segment after the killed one has ended.
        wait_for(lambda: len(json.loads((seed / "segments.json").read_text())["segments"]) > killed
                 if (seed / "segments.json").exists() else False, 240, "the next segment recorded", first)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    before = json.loads((seed / "segments.json").read_text())["segments"]
    run_snakemake(ws, "--unlock", *LOCAL)
    run_snakemake(ws, *LOCAL, "--", target, timeout=600)
    chain = json.loads((seed / "segments.json").read_text())["segments"]
    print(f"killed at step {at_kill}: " + "; ".join(f"{s['from_step']}->{s['to_step']} {s['status']}" for s in chain))
    assert chain[killed - 1]["status"] == "killed"
    assert at_kill - chain[killed]["from_step"] <= CKPT_EVERY  # lost at most one checkpoint interval
    if before[-1]["status"] == "success":
        # The segment after the killed one reached the target (this run was faster than seed 1's, whose
        # time set the limit): the workflow died after the run's end; the rerun kept it, training nothing.
        assert chain == before
    else:
        after_restart = chain[len(before)]
        assert after_restart["from_step"] >= before[-1]["to_step"]  # the workflow's death lost nothing saved
    assert chain[-1]["status"] == "success"
    uninterrupted = evals(ws / "results/mini_gpt/seed_1/mllog.txt")
    assert [v for _, v in evals(seed / "mllog.txt")] == pytest.approx([v for _, v in uninterrupted], abs=1e-6)


def rank(seed: Path, number: int) -> proctree.Proc | None:
    """The training process of rank `number` of the seed's running attempt."""
    for p in proctree.find(proctree.seed_marker(seed)):
        try:
            env = Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "train.py" in p.command and f"RANK={number}".encode() in env:
            return p
    return None


def test_a_hung_rank_is_stopped_within_its_timeout_and_the_seed_resumes_to_the_same_loss(scored):
    ws = scored["ws"]
    # Half the seed's training a job; a hang is no progress line for 5 x the longest interval, at least 10 s.
    variant(ws, "mini_gpt_hang", job_seconds=job_seconds(ws, 0.5, margin=2), margin=2,
            hang={"floor_seconds": 10, "multiple": 5, "startup_seconds": 120})
    seed = ws / "results/mini_gpt_hang/seed_1"
    target = "results/mini_gpt_hang/seed_1/run.json"
    proc = subprocess.Popen(snakemake_cmd(*LOCAL, "--", target), cwd=ws, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # Past a checkpoint and half-way to the next: SIGSTOP rank 1; rank 0 waits on it in every all-reduce.
        stopped = wait_for(lambda: (live := progress.live(seed) or {}).get("step", 0) >= 30
                           and live["step"] % CKPT_EVERY == 10 and rank(seed, 1), 300, "a segment mid-way", proc)
        os.kill(stopped.pid, signal.SIGSTOP)
        at = time.monotonic()
        hung = wait_for(lambda: next((s for s in json.loads((seed / "segments.json").read_text())["segments"]
                                      if s.get("class") == "hung"), None) if (seed / "segments.json").exists()
                        else None, 300, "the hang recorded", proc)
        detected = time.monotonic() - at
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    timeout = float(re.search(r"timeout (\d+) s", hung["error"]).group(1))
    print(f"hang: rank 1 stopped, detected after {detected:.0f} s (timeout {timeout:.0f} s); " + hung["error"])
    assert "no progress for" in hung["error"] and 10 <= timeout and detected <= timeout + 30
    chain = json.loads((seed / "run.json").read_text())["segments"]
    assert [s["class"] for s in chain].count("hung") == 1 and chain[-1]["class"] == "finished"
    after = chain[chain.index(hung) + 1] if hung in chain else None
    assert after is not None and after["from_step"] == hung["to_step"]  # resumed from the last checkpoint
    assert all(s["gpu_s"] > 0 for s in chain)
    uninterrupted = evals(ws / "results/mini_gpt/seed_1/mllog.txt")
    assert [v for _, v in evals(seed / "mllog.txt")] == pytest.approx([v for _, v in uninterrupted], abs=1e-6)


def test_a_damaged_last_checkpoint_is_set_aside_and_the_seed_resumes_from_the_one_before(scored):
    ws = scored["ws"]
    variant(ws, "mini_gpt_damaged", job_seconds=job_seconds(ws, 0.4, margin=2), margin=2)
    seed = ws / "results/mini_gpt_damaged/seed_1"
    target = "results/mini_gpt_damaged/seed_1/run.json"
    first = subprocess.Popen(snakemake_cmd(*LOCAL, "--", target), cwd=ws, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # The workflow dies once a segment has saved at its limit and the next is under way.
        wait_for(lambda: (seed / "segments.json").exists() and rank(seed, 0), 300, "a second segment", first)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    wait_for(lambda: rank(seed, 0) is None, 60, "the orphaned ranks stopped by their watchdog")
    folder = seed / "checkpoints"
    damaged = checkpoints.latest(folder)
    state = damaged.path / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a disk that lost its tail
    before = len(json.loads((seed / "segments.json").read_text())["segments"])
    run_snakemake(ws, "--unlock", *LOCAL)
    run_snakemake(ws, *LOCAL, "--", target, timeout=600)
    assert (folder / f"bad_step_{damaged.step:08d}").is_dir()  # set aside and named, not deleted
    chain = json.loads((seed / "run.json").read_text())["segments"]
    resumed = chain[before]  # the rerun's first segment
    print(f"damaged checkpoint of step {damaged.step}: " + "; ".join(
        f"{s['from_step']}->{s['to_step']} {s['class']}" for s in chain))
    assert resumed["from_step"] < damaged.step and chain[-1]["class"] == "finished"
    uninterrupted = evals(ws / "results/mini_gpt/seed_1/mllog.txt")
    assert [v for _, v in evals(seed / "mllog.txt")] == pytest.approx([v for _, v in uninterrupted], abs=1e-6)


def test_a_deterministic_error_fails_the_seed_once_with_the_trainers_words(scored):
    ws = scored["ws"]
    variant(ws, "mini_gpt_broken", job_seconds=job_seconds(ws, 0.5, margin=2), margin=2, retries=3,
            env={"N_HEAD": "5"})  # 192 is no multiple of 5: the trainer refuses before its first step
    proc = run_snakemake(ws, *LOCAL, "--", "results/mini_gpt_broken/seed_1/run.json", timeout=300, check=False)
    seed = ws / "results/mini_gpt_broken/seed_1"
    assert proc.returncode != 0
    failure = json.loads((seed / "failure.json").read_text())
    assert failure["class"] == "failed_before_first_step" and failure["attempts"] == ["failed_before_first_step"]
    assert any("N_EMBD=192 is not a multiple of N_HEAD=5" in line for line in failure["error_lines"])
    assert len(list(seed.glob("attempt_*"))) == 1  # not retried: 3 retries would not mend it
    from mlrepro import status
    assert "N_HEAD=5" in status.format_table([status.seed_status(1, seed)])


@pytest.fixture(scope="module")
def corpus_only(tmp_path_factory):
    """A workspace whose corpus stages have run (locally), for the Slurm test."""
    return corpus_workspace(tmp_path_factory.mktemp("mini_gpt_slurm"), "resources/corpora/mini_corpus/data_prefix.json")[0]


@pytest.mark.slurm
def test_a_chained_seed_on_the_local_slurm_cluster_survives_scancel(corpus_only, scored, slurm_cluster):
    ws = corpus_only
    # Half the seed's training a job, as in the kill test: after the scancel at step 30 or 50 two more
    # segments are needed at the speed of seed 1's run.
    variant(ws, "mini_gpt_slurm", job_seconds=job_seconds(scored["ws"], 0.5, margin=4), margin=4, system_line="mini_gpt_slurm: config_CPU_2x1x16xtp1pp1cp1.sh")
    seed = ws / "results/mini_gpt_slurm/seed_1"
    started = time.monotonic()
    proc = subprocess.Popen(snakemake_cmd("--profile", "profiles/slurm", "--config", "system=local-slurm",
                                          "--slurm-init-seconds-before-status-checks", "1", "--",
                                          "results/mini_gpt_slurm/seed_1/run.json"),
                            cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # scancel a job mid-segment, once the run is past its first checkpoint.
        def mid_segment():
            job = json.loads((seed / "job.json").read_text()) if (seed / "job.json").exists() else None
            live = progress.live(seed) or {}
            return (job if job and live.get("step", 0) >= 30 and live["step"] % CKPT_EVERY == 10
                    and slurm.job_info(job["job_id"]).state == "RUNNING" else None)

        job = wait_for(mid_segment, 600, "a job mid-way", proc)
        at_kill = progress.live(seed)["step"]
        subprocess.run(["scancel", str(job["job_id"])], check=True, timeout=60)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    run = json.loads((seed / "run.json").read_text())
    chain = run["segments"]
    last_job = json.loads((seed / "job.json").read_text())
    print(f"slurm: scancel of job {job['job_id']} at step {at_kill}; {len(chain)} segments in "
          f"{time.monotonic() - started:.0f} s: " + "; ".join(f"{s['from_step']}->{s['to_step']} {s['status']}"
                                                            for s in chain)
          + f"; time to train {run['minutes'] * 60:.1f} s, last job {last_job['job_id']}")
    assert chain[0]["status"] == "killed" and "CANCELLED" in chain[0]["error"]
    assert at_kill - chain[1]["from_step"] <= CKPT_EVERY  # lost at most one checkpoint interval
    assert run["converged"] and chain[-1]["status"] == "success"
    # Between the cancelled job and the last, each job ended at its limit and the next resumed there
    # (none when this run was much faster than seed 1's, whose time set the limit).
    assert [s["status"] for s in chain[1:-1]] == ["resume"] * (len(chain) - 2)
    assert all(a["to_step"] == b["from_step"] for a, b in zip(chain[1:], chain[2:]))
    assert last_job["scheduler"] == "slurm" and last_job["attempt"] == len(chain)
    assert run["evals"][-1][1] <= 3.495
