"""A running MLPerf seed's progress from its eval events: samples so far against the reference's
samples to converge, the recent rate, the ETA; logs cut mid-line, several runs, srun prefixes."""

from __future__ import annotations

import json
from pathlib import Path

from mlrepro.scoring import live

TARGET = {"metric": "eval_accuracy", "value": 0.925, "direction": "below"}


def line(key, value, t_ms, prefix="", **metadata):
    event = {"namespace": "", "time_ms": t_ms, "event_type": "POINT_IN_TIME", "key": key, "value": value,
             "metadata": {"file": "train.py", **metadata}}
    return f"{prefix}:::MLLOG {json.dumps(event)}\n"


def run_log(evals, start_ms=1_000_000, every_ms=2000, per_eval=160, prefix=""):
    text = "torch warnings and other noise\n" + line("run_start", None, start_ms, prefix)
    for i in range(1, evals + 1):
        text += f"step {i} loss ...\n" + line("eval_accuracy", 3.0 / i, start_ms + i * every_ms, prefix,
                                               samples_count=i * per_eval)
    return text


def test_samples_against_the_reference_and_an_eta_from_the_recent_rate():
    p = live.parse(run_log(10), "eval_accuracy", TARGET, reference=3200)
    assert p["samples"] == 1600 and p["evals"] == 10 and p["fraction"] == 0.5
    assert p["samples_per_s"] == 80.0  # 160 samples every 2 s
    assert p["eta_s"] == 20.0 and p["elapsed_s"] == 20.0
    assert live.describe(p) == ("eval 10: 1,600 of ~3,200 samples (50%), eval_accuracy 0.3 (target below 0.925), "
                                "80 samples/s, ETA 0:20")


def test_the_rate_is_the_recent_one():
    text = run_log(6, every_ms=1000)
    # then four evals at a quarter of the speed
    for i in range(7, 11):
        text += line("eval_accuracy", 1.0, 1_000_000 + 6000 + (i - 6) * 4000, samples_count=i * 160)
    p = live.parse(text, "eval_accuracy", TARGET, reference=3200)
    assert p["samples_per_s"] < 60  # not the run's mean (the fast start would say ~110)


def test_before_the_first_eval_there_is_nothing_to_say_and_past_the_reference_no_eta():
    assert live.parse("noise\n" + line("run_start", None, 5), "eval_accuracy", TARGET, 3200) is None
    p = live.parse(run_log(25), "eval_accuracy", TARGET, reference=3200)
    assert p["beyond_reference"] is True and "ETA unknown" in live.describe(p)


def test_srun_prefixes_cut_lines_and_an_earlier_run_in_the_same_log():
    earlier = run_log(30, start_ms=0)
    text = earlier + run_log(4, start_ms=500_000, prefix="0: ") + '0: :::MLLOG {"key": "eval_accuracy", "val'
    p = live.parse(text, "eval_accuracy", TARGET, reference=3200)
    assert p["evals"] == 4 and p["samples"] == 640


def test_without_a_reference_samples_and_rate_still_show():
    p = live.parse(run_log(3), "eval_accuracy", TARGET, reference=None)
    assert p["eta_s"] is None and p["fraction"] is None
    assert live.describe(p).startswith("eval 3: 480 samples, eval_accuracy 1 (target below 0.925), 80 samples/s")


def test_reference_samples_are_the_mean_of_the_converged_runs_without_the_extremes():
    runs = [{"converged": True, "samples_to_converge": s} for s in (100, 200, 300, 400, 10_000)]
    runs.append({"converged": False, "samples_to_converge": None})
    assert live.reference_samples({"score": {"runs": runs, "rcp": {}}}) == 300.0
    assert live.reference_samples({"runs": runs[:2]}) == 150.0
    assert live.reference_samples({"score": {"runs": runs, "rcp": {"rcp_mean": 2500.0}}}) == 2500.0
    assert live.reference_samples(None) is None


def test_tail_drops_a_cut_first_line(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(run_log(200))
    text = live.tail(path, limit=4096)
    first = text.splitlines()[0]
    assert len(text) < 4096 and (first.startswith("step ") or json.loads(first.removeprefix(":::MLLOG ")))
    p = live.parse(text, "eval_accuracy", TARGET, reference=64_000)
    assert p["samples"] == 200 * 160
    assert Path(path).stat().st_size > 4096
