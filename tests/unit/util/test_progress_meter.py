"""The progress meter: a report at a steady interval (never per call), rate and ETA from the recent
reports, the file status reads, several tasks' files added up, and a folder watched."""

from __future__ import annotations

import json
import logging
import threading
import time

from mlrepro.util import progress


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_reports_come_from_the_timer_at_the_interval_not_per_call(tmp_path):
    meter = progress.Meter("ckpt download", tmp_path / "p.json", total=1 << 30, interval=0.1)
    for _ in range(2000):
        meter.add(1 << 19)
    time.sleep(0.55)
    reports = meter.reports
    assert 4 <= reports <= 8  # one at the start, then one each 0.1 s: not 2000
    # a stalled transfer keeps its lines coming, with the rate it has now
    time.sleep(0.3)
    assert meter.reports >= reports + 2
    assert json.loads((tmp_path / "p.json").read_text())["done"] == 1000 << 20
    meter.close()
    stopped = meter.reports
    time.sleep(0.25)
    assert meter.reports == stopped


def test_lines_in_the_log_say_bytes_rate_and_eta(tmp_path, caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="mlrepro.util.progress"):
        meter = progress.Meter("ckpt download", tmp_path / "p.json", total=100 << 20, now=clock, timer=False)
        for _ in range(40):  # 1 MiB blocks, 2 MiB/s
            clock.t += 0.5
            meter.add(1 << 20)
        meter.report()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["ckpt download: 0 B of 100.0 MiB (0%), ETA ?",
                     "ckpt download: 40.0 MiB of 100.0 MiB (40%), 2.0 MiB/s, ETA 0:30"]


def test_rate_follows_the_last_minute_and_eta_follows_the_rate(tmp_path):
    clock = Clock()
    meter = progress.Meter("x", tmp_path / "p.json", total=1000, now=clock, timer=False)
    for _ in range(12):  # two minutes at 5 units/s
        clock.t += 10
        meter.add(50)
        meter.report()
    for _ in range(7):  # then a stall of 70 s
        clock.t += 10
        meter.report()
    record = progress.read(tmp_path / "p.json")
    assert record["done"] == 600
    assert record["rate"] < 1  # a minute without bytes: the rate says so rather than the old mean
    assert record["eta_s"] is None or record["eta_s"] > 400


def test_close_marks_the_file_finished_and_a_failed_stage_leaves_it_as_it_was(tmp_path):
    clock = Clock()
    with progress.Meter("ok", tmp_path / "ok.json", total=10, now=clock, timer=False) as meter:
        meter.add(10)
    assert progress.read(tmp_path / "ok.json")["finished"] is True
    try:
        with progress.Meter("bad", tmp_path / "bad.json", total=10, now=clock, timer=False) as meter:
            meter.add(3)
            raise RuntimeError("download failed")
    except RuntimeError:
        pass
    assert progress.read(tmp_path / "bad.json")["finished"] is False


def test_read_ages_a_file_and_calls_an_old_one_not_live(tmp_path):
    progress.write_file(tmp_path / "p.json", {"what": "x", "done": 1, "total": 2, "updated": 100.0, "finished": False})
    assert progress.read(tmp_path / "p.json", now=lambda: 110.0)["live"] is True
    old = progress.read(tmp_path / "p.json", now=lambda: 100.0 + progress.STALE_S + 1)
    assert old["live"] is False and old["age_s"] > progress.STALE_S
    assert progress.read(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"what": ')
    assert progress.read(tmp_path / "torn.json") is None


def test_tasks_of_one_stage_add_up():
    parts = [{"what": "d", "unit": "B", "done": 30, "total": 100, "rate": 10.0, "live": True, "age_s": 1},
             {"what": "d", "unit": "B", "done": 50, "total": 100, "rate": 5.0, "live": True, "age_s": 3},
             {"what": "d", "unit": "B", "done": 100, "total": 100, "rate": 20.0, "live": False, "finished": True,
              "age_s": 9}]
    total = progress.combine(parts)
    assert (total["done"], total["total"], total["rate"], total["parts"]) == (180, 300, 15.0, 3)
    assert total["eta_s"] == 8.0 and total["live"] is True and total["finished"] is False
    unknown = progress.combine([{**parts[0], "total": None}, parts[1]])
    assert unknown["total"] is None and unknown["eta_s"] is None


def test_describe_is_what_a_person_reads():
    assert progress.describe({"what": "w", "unit": "B", "done": 3 << 30, "total": 12 << 30, "rate": 100 << 20,
                              "eta_s": 3725}) == "w: 3.0 GiB of 12.0 GiB (25%), 100.0 MiB/s, ETA 1:02:05"
    assert progress.describe({"what": "w", "unit": "shards", "done": 4, "total": 9, "rate": None,
                              "eta_s": None}) == "w: 4 shards of 9 shards (44%), ETA ?"
    assert progress.describe({"what": "w", "done": 9, "total": 9, "finished": True}) == "w: done, 9 B of 9 B (100%)"


def test_the_meter_is_shared_by_threads_without_losing_counts(tmp_path):
    meter = progress.Meter("threads", tmp_path / "p.json", interval=0.001)
    threads = [threading.Thread(target=lambda: [meter.add(1) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.close()["done"] == 20000


def test_a_watched_folder_reports_the_bytes_written_into_it(tmp_path):
    dest = tmp_path / "checkpoint"
    (dest / "weights").mkdir(parents=True)
    (dest / "old.bin").write_bytes(b"x" * 100)  # there before: not counted
    with progress.watch_folder("script", dest, tmp_path / "p.json", total=5000, interval=0.05) as meter:
        for i in range(5):
            (dest / "weights" / f"part{i}").write_bytes(b"y" * 1000)
            time.sleep(0.06)
        middle = json.loads((tmp_path / "p.json").read_text())
    assert 0 < middle["done"] <= 5000 and meter.reports >= 3
    assert json.loads((tmp_path / "p.json").read_text())["done"] == 5000
    assert progress.folder_size(tmp_path / "nowhere") == 0


def test_a_progress_file_is_as_private_as_the_runs_umask_and_reading_it_leaves_the_umask(tmp_path):
    """CI: checkpoint.progress.json was chmod 0644 in a run whose every other file is private (umask 077)."""
    import os
    import stat

    from mlrepro.util import fsutil

    old = os.umask(0o077)
    try:
        progress.write_file(tmp_path / "p.json", {"done": 1})
        assert stat.S_IMODE((tmp_path / "p.json").stat().st_mode) == 0o600
        assert fsutil.current_umask() == 0o077 and os.umask(0o077) == 0o077  # read, never changed
        os.umask(0o022)
        progress.write_file(tmp_path / "q.json", {"done": 1})
        assert stat.S_IMODE((tmp_path / "q.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)
