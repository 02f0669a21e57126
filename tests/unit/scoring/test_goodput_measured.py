"""The effective training time (mlrepro.scoring.goodput) on the records of a real run: mini_gpt's seed 1
on the local Slurm cluster with failures injected (tests/fixtures/goodput/, cut from
tests/slurm/test_goodput_slurm.py's run), and that run's records changed where a cause did not occur in it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mlrepro import paths
from mlrepro.paths import SeedPaths
from mlrepro.scoring import goodput
from mlrepro.util.fsutil import atomic_write_json

RUN = json.loads((Path(__file__).resolve().parents[2] / "fixtures/goodput/slurm_injected_seed_1.json").read_text())


def records():
    return copy.deepcopy(RUN["segments"]), copy.deepcopy(RUN["attempts"])


def test_the_effective_time_is_productive_steps_times_the_step_time_over_every_attempts_elapsed_time():
    segments, attempts = records()
    g = goodput.seed_goodput(segments, attempts)
    assert [s["class"] for s in segments] == ["injected", "injected", "injected", "finished"]
    # each attempt's new steps at its own steady pace: 80 in attempt 1, 40 in attempt 4
    assert g["productive_steps"] == 120 and g["productive_s"] == pytest.approx(80 * 0.61655 + 40 * 0.62775, abs=0.01)
    assert g["step_s"] == pytest.approx(g["productive_s"] / 120)
    assert g["total_s"] == sum(a["elapsed_s"] for a in attempts) == 104  # sacct's elapsed, the queue not in it
    assert g["effective"] == pytest.approx(g["productive_s"] / 104)
    # every second of the attempts is productive or lost to one cause
    assert g["productive_s"] + sum(g["lost_s"].values()) == pytest.approx(g["total_s"], abs=0.01)
    # attempts 2 and 3 were killed before their first step: their whole time is lost as failed attempts
    assert g["lost_s"]["failed_attempts"] == 6 + 3
    assert g["queue_s"] == 1  # start - submit of each job, shown apart
    # attempt 1 was killed at step 90 (its last timed line), 10 steps after its last save
    assert g["lost_s"]["redone"] == 6.8
    assert g["attempts"] == 4 and g["failures"] == 3 and g["finished"]


def test_restart_start_up_and_checkpoint_costs_are_measured_from_the_records():
    segments, attempts = records()
    g = goodput.seed_goodput(segments, attempts)
    rows = {r["attempt"]: r for r in g["per_attempt"]}
    # attempt 4 resumed at step 80; its 40 steps' timed lines add up to 23.377 s of its 34 s
    assert rows[4]["lost_s"]["restart"] == pytest.approx(34 - 23.377)
    assert g["restart_cost_s"] == rows[4]["lost_s"]["restart"]  # the one attempt that resumed and trained
    assert g["startup_s"] == rows[1]["lost_s"]["restart"] == pytest.approx(61 - 55.217)
    assert goodput.restart_cost(g["per_attempt"]) == g["restart_cost_s"]
    assert g["checkpoint_cost_s"] == goodput.checkpoint_cost(segments) == pytest.approx((0.278 + 0.067) / 5)
    assert g["checkpoint_interval_steps"] == goodput.checkpoint_interval(segments) == 20  # mini_gpt's CKPT_EVERY


def test_steps_trained_again_after_a_set_aside_checkpoint_are_redone_time():
    segments, attempts = records()
    # a damaged checkpoint of step 80 set aside: attempt 4 resumed from step 60 and trained 60-80 again
    segments[3]["from_step"] = 60
    g = goodput.seed_goodput(segments, attempts)
    assert g["lost_s"]["redone"] == pytest.approx(6.8 + 20 * 0.62775)
    assert g["productive_steps"] == 120 and g["productive_s"] == pytest.approx(80 * 0.61655 + 40 * 0.62775, abs=0.01)
    assert g["productive_s"] + sum(g["lost_s"].values()) == pytest.approx(104, abs=0.01)


def test_a_hang_until_it_was_detected_is_its_own_cause():
    segments, attempts = records()
    segments[0].update({"class": "hung", "hang_s": 30.0})
    g = goodput.seed_goodput(segments, attempts)
    assert g["lost_s"]["hang"] == 30.0
    # 61 s - 55.2 s of timed steps - a 30 s hang leaves nothing for its start-up: none, never negative;
    # what the timed steps and the hang's quiet time overcount is unattributed, below zero
    first = g["per_attempt"][0]["lost_s"]
    assert first["restart"] == 0.0 and first["unattributed"] < 0
    assert g["productive_s"] + sum(g["lost_s"].values()) == pytest.approx(104, abs=0.01)


def test_a_seed_that_ran_as_one_job_counts_its_run_time_and_its_failed_attempts():
    _, attempts = records()
    g = goodput.seed_goodput([], attempts[2:], run_seconds=23.5)
    assert g["productive_s"] == pytest.approx(23.5) and g["total_s"] == 3 + 34
    assert g["lost_s"]["failed_attempts"] == 3 and g["lost_s"]["restart"] == pytest.approx(34 - 23.5)
    assert goodput.seed_goodput([], []) is None


def test_a_benchmark_sums_its_seeds_and_reads_them_from_their_folders(tmp_path):
    segments, attempts = records()
    for seed in (1, 2):
        files = SeedPaths(tmp_path / "mini_gpt" / f"seed_{seed}")
        files.folder.mkdir(parents=True)
        atomic_write_json(files.segments, {"segments": segments if seed == 1 else segments[3:]})
        for a in (attempts if seed == 1 else attempts[3:]):
            here = files.attempt(a["attempt"])
            here.folder.mkdir()
            atomic_write_json(here.record, a)
    # seed 2's plan chose its interval (the kind writes it into plan.json); seed 1 ran before plans said
    chosen = {"steps": 7, "seconds": 4.3, "chosen_by": "Young/Daly"}
    atomic_write_json(paths.plan_file(tmp_path / "mini_gpt" / "seed_2"), {"checkpoint_interval": chosen})
    g = goodput.benchmark_goodput(tmp_path / "mini_gpt")
    one, two = g["seeds"]["1"], g["seeds"]["2"]
    assert one == {**goodput.seed_goodput(segments, attempts), "planned_interval": None}
    assert two["planned_interval"] == g["planned_interval"] == chosen
    assert g["total_s"] == one["total_s"] + two["total_s"] == 104 + 34
    assert g["effective"] == pytest.approx((one["productive_s"] + two["productive_s"]) / 138)
    assert g["lost_s"]["failed_attempts"] == 9
    # the report's section and status's line say the same
    html = goodput.section({"goodput": g})
    assert "id='goodput-table'" in html and goodput.percent(g["effective"]) in html and "restart and start-up" in html
    assert goodput.interval_words(g).startswith("checkpoint interval 20 steps (12.5 s at 0.624 s a step); planned 7 ")
    assert goodput.interval_words(g) + "." in html and "planned 7 steps (Young/Daly)" in html
    assert goodput.status_line("seed 1", one).startswith(f"seed 1: effective training time {goodput.percent(one['effective'])}")
    row = goodput.summary_columns({"goodput": g})
    assert row["effective_training_time"] == g["effective"] and row["lost_failed_attempts_s"] == 9
