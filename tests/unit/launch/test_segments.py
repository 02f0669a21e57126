"""mlrepro.pretrain: checkpoint retention, the chain of time-limited segments, live progress (no Snakemake)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlrepro.formats import checkpoints
from mlrepro.launch import chain as segments
from mlrepro.launch.job import SeedFailed
from mlrepro.paths import SeedPaths
from mlrepro.pretrain import progress


def _save(folder: Path, step: int, val_loss: float | None) -> Path:
    return checkpoints.save(folder, step, lambda d: (d / "state.bin").write_bytes(step.to_bytes(4, "little")),
                            {"val_loss": val_loss})


def test_save_is_atomic_and_half_written_checkpoints_are_not_resumed_from(tmp_path):
    _save(tmp_path, 20, 4.0)
    # What a kill in the middle of a save leaves: a temporary folder, and a step folder without meta.json.
    (tmp_path / ".tmp_step_00000040.123").mkdir()
    (tmp_path / "step_00000060").mkdir()
    assert checkpoints.latest(tmp_path).step == 20
    assert (checkpoints.latest(tmp_path).path / "state.bin").read_bytes() == (20).to_bytes(4, "little")
    checkpoints.prune(tmp_path, keep_last=1, keep_best=0)
    assert not (tmp_path / ".tmp_step_00000040.123").exists()


def test_retention_keeps_the_last_k_and_the_best_by_validation_loss(tmp_path):
    losses = {20: 5.0, 40: 3.1, 60: 4.0, 80: 3.0, 100: 3.5, 120: 3.6, 140: None}
    for step, loss in losses.items():
        _save(tmp_path, step, loss)
    removed = checkpoints.prune(tmp_path, keep_last=2, keep_best=2)
    kept = [c.step for c in checkpoints.listing(tmp_path)]
    assert kept == [40, 80, 120, 140]  # best two (80: 3.0, 40: 3.1) plus the last two
    assert sorted(removed) == [20, 60, 100]
    # The NeMo guide's policy: top 10 by val_loss plus the last.
    found = [checkpoints.Checkpoint(s, tmp_path, 10.0 - s / 100) for s in range(0, 2000, 100)]
    assert checkpoints.to_keep(found, keep_last=1, keep_best=10) == set(range(1000, 2000, 100))
    assert checkpoints.to_keep(found, keep_last=0, keep_best=0, keep_every=500) == {0, 500, 1000, 1500, 1900}


def test_limits_take_the_shorter_of_benchmark_and_system():
    assert segments.limits(None, 30) is None
    lim = segments.limits({"job_seconds": 600, "margin_seconds": 30, "save_signal_seconds": 45}, 5)
    assert lim.job_seconds == 300 and lim.margin_seconds == 30 and lim.save_signal_seconds == 45
    assert segments.limits({"job_seconds": None, "save_signal_seconds": 45}, None) == segments.Limits(None, 0, 0)
    env = segments.run_env(lim, Path("/r/seed_1"))
    assert env == {"CHECKPOINT_DIR": "/r/seed_1/checkpoints", "JOB_SECONDS": "300", "MARGIN_SECONDS": "30"}
    assert segments.walltime_minutes(lim, 45) == 5
    assert segments.walltime_minutes(segments.Limits(14, 2), 45) == 1
    assert segments.walltime_minutes(segments.Limits(None, 0), 45) == 45


class Trainer:
    """Stands in for one job of a deterministic trainer: it resumes from the last checkpoint, trains
    `per_segment` steps (printing each, checkpointing every `every`) and stops, or is killed after
    `kill_after` steps."""

    def __init__(self, seed_dir: Path, total: int, per_segment: int, every: int = 10):
        self.seed_dir, self.total, self.per_segment, self.every = seed_dir, total, per_segment, every
        self.kill_after: dict[int, int] = {}  # call number -> steps before the kill
        self.calls = 0

    def __call__(self, _plan=None, _system=None, _log=None) -> None:
        self.calls += 1
        folder = self.seed_dir / SeedPaths.CHECKPOINTS
        last = checkpoints.latest(folder)
        step = start = last.step if last else 0
        lines = [f"mini_gpt: resuming from {folder} (step {start})"] if start else []
        limit = self.kill_after.get(self.calls, self.per_segment)
        while step < self.total and step - start < limit:
            step += 1
            lines.append(f"mini_gpt progress: step {step}/{self.total} tokens 1 loss 3.0 iter_s 0.5000")
            if step % self.every == 0:
                _save(folder, step, 10.0 / step)
        log = self.seed_dir / "run.log"
        if self.calls in self.kill_after:
            log.write_text("\n".join(lines) + "\n")
            raise SeedFailed(f"killed at step {step}")
        if step < self.total:
            _save(folder, step, 10.0 / step)
            status = "resume"
        else:
            status = "success"
            lines.append(':::MLLOG {"key": "run_stop", "value": null}')
        record = {"status": status, "from_step": start, "to_step": step, "train_s": 1.0}
        log.write_text("\n".join(lines) + f"\nmini_gpt segment: {json.dumps(record)}\n")


def plan_of(seed_dir: Path):
    return SimpleNamespace(seed_dir=seed_dir, seed=1, ranks=2)


def chain(seed_dir: Path, trainer, retries: int = 2, finish=None):
    return segments.run_seed(plan_of(seed_dir), None, seed_dir / "run.log", trainer, segments.Limits(10, 1), retries,
                             finish)


def test_a_run_longer_than_its_job_runs_as_chained_segments(tmp_path):
    trainer = Trainer(tmp_path, total=100, per_segment=35)
    finished = []
    state = chain(tmp_path, trainer, finish=lambda: finished.append(True))
    steps = [(s["from_step"], s["to_step"], s["status"], s["class"]) for s in state["segments"]]
    assert steps == [(0, 35, "resume", "saved_at_limit"), (35, 70, "resume", "saved_at_limit"),
                     (70, 100, "success", "finished")]
    assert json.loads((tmp_path / SeedPaths.SEGMENTS).read_text()) == state
    assert segments.summary(tmp_path) == state["segments"]
    assert finished == [True]  # the finished attempt's log taken as the result, once
    assert all(s["lost_steps"] == 0 and s["gpu_s"] == round(s["wall_s"] * 2, 1) for s in state["segments"])


def test_a_killed_segment_resumes_from_the_last_good_checkpoint_and_its_lost_work_is_recorded(tmp_path):
    trainer = Trainer(tmp_path, total=100, per_segment=40, every=10)
    trainer.kill_after = {2: 27}  # the second job dies at step 67, 7 steps after its last checkpoint
    state = chain(tmp_path, trainer)
    killed = state["segments"][1]
    assert killed["status"] == "killed" and "killed at step 67" in killed["error"] and killed["to_step"] == 60
    assert killed["class"] == "failed_mid_run" and killed["lost_steps"] == 7 and killed["lost_s"] == 3.5
    assert state["segments"][2]["from_step"] == 60
    assert state["segments"][-1]["status"] == "success" and trainer.calls == 3


def test_the_chain_goes_on_after_the_orchestrator_died_between_segments(tmp_path):
    trainer = Trainer(tmp_path, total=90, per_segment=30)

    def dies_after_first(*_):
        trainer()
        if trainer.calls == 1:
            raise KeyboardInterrupt  # the workflow killed once the first job has ended

    with pytest.raises(KeyboardInterrupt):
        chain(tmp_path, dies_after_first)
    assert not (tmp_path / SeedPaths.SEGMENTS).exists()  # the segment's record was not written...
    # ...but its checkpoint was: the next run of the workflow starts from it, and takes its log back
    # (mlrepro.launch.adopt) so that its training time counts.
    assert not segments.take_back(tmp_path, tmp_path / "run.log")
    state = chain(tmp_path, trainer)
    assert [(s["from_step"], s["train_s"]) for s in state["segments"]] == [(0, 1.0), (30, 1.0), (60, 1.0)]


def test_segments_the_workflow_died_after_are_taken_back_once_and_the_last_ends_the_chain(tmp_path):
    trainer = Trainer(tmp_path, total=60, per_segment=40)
    log = tmp_path / "run.log"
    trainer()  # 0->40, and the workflow dies before recording it
    assert not segments.take_back(tmp_path, log)  # "resume": the chain goes on from its checkpoint
    trainer()  # 40->60, the run's end, and the workflow dies again
    assert segments.take_back(tmp_path, log) and segments.take_back(tmp_path, log)
    recorded = [(s["from_step"], s["to_step"], s["status"], s["train_s"]) for s in segments.summary(tmp_path)]
    assert recorded == [(0, 40, "resume", 1.0), (40, 60, "success", 1.0)]


def test_failed_segments_without_progress_use_up_the_one_budget(tmp_path):
    trainer = Trainer(tmp_path, total=100, per_segment=30)
    trainer.kill_after = {2: 5, 3: 5, 4: 5}  # each trains 5 steps and dies before a checkpoint
    with pytest.raises(SeedFailed, match="3 failed attempt"):
        chain(tmp_path, trainer, retries=2)
    recorded = segments.read_state(tmp_path)["segments"]
    assert [s["class"] for s in recorded] == ["saved_at_limit"] + ["failed_mid_run"] * 3
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["class"] == "failed_mid_run" and failure["attempts"] == [s["class"] for s in recorded]


def test_progress_between_failures_refills_the_budget(tmp_path):
    trainer = Trainer(tmp_path, total=100, per_segment=30)
    trainer.kill_after = {2: 15, 3: 15, 4: 15}  # each dies 5 steps past a checkpoint of its own
    state = chain(tmp_path, trainer, retries=1)
    assert [s["class"] for s in state["segments"]][:4] == ["saved_at_limit"] + ["failed_mid_run"] * 3
    assert state["segments"][-1]["class"] == "finished"


def test_a_segment_that_dies_before_its_first_step_ends_the_seed_at_once(tmp_path):
    trainer = Trainer(tmp_path, total=100, per_segment=30)

    def config_error(*_):
        if trainer.calls == 1:
            (tmp_path / "run.log").write_text("ValueError: --bogus is not a flag\n")
            trainer.calls += 1
            raise SeedFailed("exited with 2")
        trainer()

    trainer()  # a first segment saved at 30
    with pytest.raises(SeedFailed, match="before its first new step"):
        chain(tmp_path, config_error, retries=5)
    assert len(segments.read_state(tmp_path)["segments"]) == 1
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["error_lines"] == ["ValueError: --bogus is not a flag"]
    assert checkpoints.latest_step(tmp_path / SeedPaths.CHECKPOINTS) == 30  # not a checkpoint's fault: kept


def test_a_checkpoint_the_resume_cannot_load_is_set_aside_once_and_the_previous_one_used(tmp_path):
    trainer = Trainer(tmp_path, total=60, per_segment=25, every=10)
    trainer()  # saves 10, 20 and 25 (its limit)
    loads = []

    def truncated_then_fine(*_):
        folder = tmp_path / SeedPaths.CHECKPOINTS
        if not loads:
            loads.append(checkpoints.latest_step(folder))
            (tmp_path / "run.log").write_text("Traceback (most recent call last):\n"
                                               "RuntimeError: PytorchStreamReader failed reading zip archive\n")
            raise SeedFailed("exited with 1")
        trainer()

    state = chain(tmp_path, truncated_then_fine, retries=0)
    first = state["segments"][0]
    assert loads == [25] and first["class"] == "failed_before_first_step"
    assert first["set_aside"].endswith("bad_step_00000025") and first["to_step"] == 20
    assert state["segments"][1]["from_step"] == 20 and state["segments"][-1]["class"] == "finished"


def test_a_checkpoint_whose_files_are_not_what_was_written_is_set_aside_before_the_resume(tmp_path):
    trainer = Trainer(tmp_path, total=50, per_segment=25, every=10)
    trainer()  # 10, 20, 25
    folder = tmp_path / SeedPaths.CHECKPOINTS
    last = checkpoints.latest(folder)
    meta = json.loads((last.path / "meta.json").read_text())
    (last.path / "meta.json").write_text(json.dumps({**meta, "files": {"state.bin": 4}}))
    (last.path / "state.bin").write_bytes(b"\0")  # truncated after it was written
    state = chain(tmp_path, trainer)
    assert state["segments"][0]["from_step"] == 20 and (folder / "bad_step_00000025").is_dir()
    assert state["segments"][-1]["class"] == "finished"


MINI_LOG = """\
mini_gpt progress: step 10/400 tokens 20480 loss 5.8192 iter_s 0.2000
:::MLLOG {"key": "eval_accuracy"}
mini_gpt progress: step 20/400 tokens 40960 loss 4.8343 iter_s 0.1000
mini_gpt progress: step 30/400 tokens 61440 loss 4.2177 iter_s 0.1200
"""

MEGATRON_LOG = """\
 [2026-11-23 10:00:01] iteration      100/    1000 | consumed samples:        25600 | elapsed time per iteration (ms): 250.0 | throughput per GPU (TFLOP/s/GPU): 80.1 | learning rate: 5.999E-04 | global batch size:   256 | lm loss: 4.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2026-11-23 10:00:26] iteration      200/    1000 | consumed samples:        51200 | elapsed time per iteration (ms): 230.0 | throughput per GPU (TFLOP/s/GPU): 81.0 | learning rate: 5.990E-04 | global batch size:   256 | lm loss: 3.900000E+00 | loss scale: 1.0 | grad norm: 1.100 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def test_progress_from_a_mini_gpt_and_a_megatron_log():
    mini = progress.parse(MINI_LOG)
    assert mini["step"] == 30 and mini["tokens"] == 61440 and mini["loss"] == pytest.approx(4.2177)
    assert mini["iter_s"] == pytest.approx(0.14) and mini["eta_s"] == pytest.approx(370 * 0.14, abs=0.1)
    mega = progress.parse(MEGATRON_LOG, seq_len=2048)
    assert (mega["step"], mega["max_steps"], mega["tokens"]) == (200, 1000, 51200 * 2048)
    assert mega["loss"] == pytest.approx(3.9) and mega["eta_s"] == pytest.approx(800 * 0.24)
    assert progress.parse("no progress here\n") is None
    assert "step 30/400, 61,440 tokens, loss 4.218, ETA 0:52" in progress.describe(mini)


def test_status_shows_a_running_pretraining_seed_with_its_progress(tmp_path):
    from mlrepro import status

    seed = tmp_path / "seed_1"
    (seed / "attempt_2").mkdir(parents=True)
    (seed / "attempt_2" / "run.log").write_text(MINI_LOG)
    (seed / "job.json").write_text(json.dumps({"scheduler": "local", "attempt": 2,
                                               "logdir": str(seed / "attempt_2")}))
    row = status.seed_status(1, seed)
    assert row.state == status.RUNNING and row.progress["step"] == 30
    assert "step 30/400" in status.format_table([row]) and "ETA" in row.reason
    # A log nobody has written to for long is a dead attempt, not a running seed.
    old = os.stat(seed / "attempt_2" / "run.log").st_mtime - 3600
    os.utime(seed / "attempt_2" / "run.log", (old, old))
    assert status.seed_status(1, seed).state == status.NOT_STARTED


def test_the_report_shows_each_segment_of_a_chained_seed():
    from mlrepro.scoring import report

    chain = [{"index": 1, "from_step": 0, "to_step": 47, "train_s": 12.1, "wall_s": 21.0, "status": "resume"},
             {"index": 2, "from_step": 40, "to_step": 90, "train_s": 9.0, "wall_s": 15.0, "status": "killed",
              "error": "Slurm job 12 ended CANCELLED"},
             {"index": 3, "from_step": 80, "to_step": 170, "train_s": 5.8, "wall_s": 11.1, "status": "success",
              "val_loss": 3.4929}]
    html = report._segments_html([{"seed": 1, "segments": chain}, {"seed": 2, "segments": chain[:1]}])
    assert html.count("<tr>") == 4 and "80 &rarr; 170" in html and "CANCELLED" in html and "3.4929" in html
    classed = [{**chain[1], "class": "hung", "gpu_s": 120.0, "lost_steps": 7, "lost_s": 3.5,
                "error_lines": ["no progress for 700 s"]}, {**chain[2], "class": "finished", "lost_steps": 0}]
    html = report._segments_html([{"seed": 1, "segments": classed}])
    assert "<td class='bad'>hung</td>" in html and "7 steps, 3.5 s" in html and ">120<" in html
    assert "no progress for 700 s" in html and "<td class='ok'>finished</td>" in html
    assert report._segments_html([{"seed": 2, "segments": chain[:1]}]) == ""  # one job: nothing to show


def test_a_cancelled_job_is_one_more_segment_but_changed_inputs_still_fail_the_seed(tmp_path):
    from mlrepro.launch import job as launch

    trainer = Trainer(tmp_path, total=60, per_segment=30)
    calls = []

    def launch_one(_plan, _system, _log):
        calls.append(1)
        if len(calls) == 2:  # the second job is scancel'd before it trains
            launch.record_failure(tmp_path, "Slurm job 7 ended CANCELLED", state="CANCELLED")
            raise launch.SeedFailed("Slurm job 7 ended CANCELLED", retry=False)
        trainer()

    state = chain(tmp_path, launch_one, retries=0)
    assert [s["status"] for s in state["segments"]] == ["resume", "killed", "success"]
    assert state["segments"][1]["class"] == "cancelled"  # not a failure: the budget of 0 retries is untouched
    assert "CANCELLED" in state["segments"][1]["error"] and not (tmp_path / "failure.json").exists()

    def changed(_plan, _system, _log):
        launch.record_failure(tmp_path, "input files changed", state="INPUT_CHANGED")
        raise launch.SeedFailed("inputs changed", retry=False)

    with pytest.raises(launch.SeedFailed, match="inputs changed"):
        chain(tmp_path, changed)
