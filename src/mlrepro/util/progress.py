"""How far a long stage is: units done, the recent rate and an ETA, told at a steady interval.

A `Meter` is told what is done (`add` from a download loop, `set` from a watcher) and, no more
often than every `interval` seconds, writes one line to the stage's log and a small JSON file
that `mlrepro status` reads while the stage runs:

    {"what": "mini_corpus download", "unit": "B", "done": 1048576, "total": 4194304,
     "rate": 524288.0, "eta_s": 6.0, "elapsed_s": 2.0, "updated": 1795729300.1, "finished": false}

The reports come from a timer thread; `add` costs a lock, so a loop that calls it per 1 MiB block
does not slow down (benchmarks/progress_overhead.py measures it). Several processes of one stage
(download tasks of a Slurm array) each write their own file; `combine` adds them up.

A download that another program does (an implementation's download script in its container)
says nothing of its bytes: `watch_folder` samples the size of the folder it writes instead.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

from mlrepro.util import fsutil

# A long stage's log gets a line this often, and status sees numbers this fresh (a test watching a
# short download sets MLREPRO_PROGRESS_SECONDS lower).
INTERVAL_S = float(os.environ.get("MLREPRO_PROGRESS_SECONDS") or 10.0)
WINDOW_S = 60.0    # the rate is measured over the reports of the last minute (a stall shows quickly)
STALE_S = 120.0    # a file not updated for longer belongs to a stage that is no longer at work

log = logging.getLogger(__name__)


def human(n: float | None, unit: str = "B") -> str:
    """1536 -> '1.5 KiB' for bytes; other units keep their counts: 12,345 samples."""
    if n is None:
        return "?"
    if unit != "B":
        return f"{n:,.0f} {unit}"
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or prefix == "Ti":
            return f"{n:.0f} B" if not prefix else f"{n:.1f} {prefix}B"
        n /= 1024
    raise AssertionError("unreachable")


def clock(seconds: float | None) -> str:
    """75 -> '1:15', 3725 -> '1:02:05'; None -> '?'."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def describe(p: dict) -> str:
    """'12.0 MiB of 48.0 MiB (25%), 3.0 MiB/s, ETA 0:12' (or 'done' when finished)."""
    unit = p.get("unit", "B")
    done, total = p.get("done"), p.get("total")
    text = human(done, unit)
    if total:
        text += f" of {human(total, unit)} ({100 * done / total:.0f}%)"
    if p.get("finished"):
        return f"{p.get('what', '')}: done, {text}".lstrip(": ")
    rate = p.get("rate")
    if rate is not None:
        text += f", {human(rate, unit)}/s"
    text += f", ETA {clock(p.get('eta_s'))}" if total else ""
    return f"{p.get('what', '')}: {text}".lstrip(": ")


def write_file(path: Path, record: dict) -> None:
    """Atomically, without fsync: a progress file is a glimpse, not a result to trust after a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.chmod(tmp, 0o666 & ~fsutil.current_umask())  # private where the run's umask is (its results are)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Meter:
    """Units done (bytes by default), reported every `interval` seconds to `logger` and `file`.

    The reports come from a timer thread, so a transfer that stalls still gets its line (rate 0)
    rather than falling silent; `add` only counts, under a lock (the workers of a download share
    one meter). `sample`, if given, is asked for the units done before each report (a folder's
    size, see watch_folder). `total` may be unknown (None) or estimated as work proceeds
    (`estimate_total`). `close()` stops the timer and writes the last report, finished=True.
    """

    def __init__(self, what: str, file: str | os.PathLike | None = None, *, total: float | None = None,
                 unit: str = "B", interval: float | None = None, logger: logging.Logger | None = None,
                 now: Callable[[], float] = time.monotonic, sample: Callable[[], float] | None = None,
                 timer: bool = True):
        self.what, self.unit = what, unit
        self.interval = INTERVAL_S if interval is None else interval
        self.file = Path(file) if file is not None else None
        self.total = total
        self.done = 0.0
        self.reports = 0
        self._log = logger or log
        self._now = now
        self._sample = sample
        self._lock = threading.Lock()
        self._start = now()
        self._points: deque[tuple[float, float]] = deque([(self._start, 0.0)])
        self._closed = False
        self._stop = threading.Event()
        self.report()  # a status read at once sees the stage at work, with 0 done
        self._timer = None
        if timer:
            self._timer = threading.Thread(target=self._tick, name=f"progress {what}", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def add(self, n: float) -> None:
        with self._lock:
            self.done += n

    def set(self, done: float) -> None:
        with self._lock:
            self.done = done

    def add_total(self, n: float) -> None:
        with self._lock:
            self.total = (self.total or 0) + n

    def estimate_total(self, total: float) -> None:
        """A better guess of the total (never below what is done)."""
        with self._lock:
            self.total = max(total, self.done)

    def set_total(self, total: float | None) -> None:
        """The total, known at last (an estimate's shards that were not on the server count no more)."""
        with self._lock:
            self.total = total

    def snapshot(self, finished: bool = False) -> dict:
        if self._sample is not None:
            self.set(self._sample())
        with self._lock:
            t = self._now()
            done, total = self.done, self.total
            points = self._points
            if not points or t > points[-1][0]:
                points.append((t, done))
            while len(points) > 2 and t - points[1][0] >= WINDOW_S:
                points.popleft()
            (t0, d0), (t1, d1) = points[0], points[-1]
        rate = (d1 - d0) / (t1 - t0) if t1 > t0 else None
        eta = None
        if total is not None and rate:
            eta = max(0.0, total - done) / rate
        elif total is not None and done >= total:
            eta = 0.0
        return {"what": self.what, "unit": self.unit, "done": done, "total": total,
                "rate": None if rate is None else round(rate, 3), "eta_s": None if eta is None else round(eta, 1),
                "elapsed_s": round(t - self._start, 1), "updated": time.time(), "finished": finished,
                "pid": os.getpid()}

    def report(self, finished: bool = False) -> dict:
        with self._lock:
            self.reports += 1
        record = self.snapshot(finished)
        self._log.info("%s", describe(record))
        if self.file is not None:
            try:
                write_file(self.file, record)
            except OSError as exc:  # progress is a courtesy: a full disk fails the stage elsewhere, not here
                self._log.warning("cannot write %s: %s", self.file, exc)
        return record

    def stop(self) -> None:
        """No more reports from the timer (the file keeps the last one)."""
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join()

    def close(self) -> dict | None:
        if self._closed:
            return None
        self._closed = True
        self.stop()
        return self.report(finished=True)

    def __enter__(self) -> "Meter":
        return self

    def __exit__(self, *exc) -> None:
        # A stage that failed leaves its last report unfinished: status ages it out as stale.
        if exc[0] is None:
            self.close()
        else:
            self.stop()


def folder_size(folder: Path) -> int:
    """Bytes of the files under `folder` (not following links); 0 when it does not exist yet."""
    total = 0
    stack = [Path(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue  # removed between the listing and the stat: a download renaming its part file
    return total


def watch_folder(what: str, folder: str | os.PathLike, file: str | os.PathLike | None = None, *,
                 total: float | None = None, interval: float | None = None) -> Meter:
    """A meter of the bytes written under `folder` from now on (a download another program does,
    such as an implementation's download script in its container), sampled at each report.

        with progress.watch_folder("llama2_lora checkpoint", dest, file, total=expected):
            run(download_script)
    """
    folder = Path(folder)
    before = folder_size(folder)
    return Meter(what, file, total=total, interval=interval, sample=lambda: max(0, folder_size(folder) - before))


def read(path: str | os.PathLike, now: Callable[[], float] = time.time) -> dict | None:
    """A progress file with its age (age_s) and whether it is live; None when absent or unreadable."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    record["age_s"] = round(max(0.0, now() - float(record.get("updated", 0))), 1)
    record["live"] = not record.get("finished") and record["age_s"] < STALE_S
    return record


def combine(records: Iterable[dict], what: str | None = None) -> dict | None:
    """Several processes' files of one stage as one: done, totals and rates added up; the ETA from those."""
    records = [r for r in records if r]
    if not records:
        return None
    done = sum(r.get("done") or 0 for r in records)
    totals = [r.get("total") for r in records]
    total = sum(totals) if all(t is not None for t in totals) else None
    live = [r for r in records if r.get("live")]
    rate = sum(r.get("rate") or 0 for r in live) if live else None
    eta = max(0.0, total - done) / rate if total is not None and rate else None
    return {"what": what or records[0].get("what"), "unit": records[0].get("unit", "B"), "done": done,
            "total": total, "rate": rate, "eta_s": None if eta is None else round(eta, 1),
            "finished": all(r.get("finished") for r in records), "live": bool(live),
            "age_s": min(r.get("age_s", 0) for r in records), "parts": len(records)}
