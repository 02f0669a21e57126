"""TensorBoard event files both ways: a trainer's scalars read, and a scored seed's curve written.

Read: the tfevents a trainer wrote into a folder (Megatron-LM's `--tensorboard-dir`, Megatron-DeepSpeed's),
through tensorboard's own record reader (`event_file_loader`), as scalar series by tag, each a list of
(step, value). A file that is not a regular file, too large, truncated or corrupt is never a traceback:
its readable records count and the rest is named in `skipped` with the reason (a trainer killed mid-write
leaves a truncated last record, and a live run's file ends mid-record while it is read).

Write: a scored seed's curve (run.json's `evals`, the metric by samples; Megatron's `curve`, the training loss
by iteration) as one event file through tensorboard's own writer (`EventFileWriter`) into the seed's folder
under results/tensorboard/ (`mlrepro.paths.scored_tensorboard_dir`), so that `tensorboard --logdir results/`
shows every seed of every benchmark side by side.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import time
from pathlib import Path
from typing import Iterable, Sequence

from mlrepro.util.fsutil import atomic_dir

# The trainers' tags for one quantity. Megatron-LM (megatron/training/training.py at the pinned commit) names
# loss_dict's key ('lm loss'), the validation '{key} validation' and with --log-timers-to-tensorboard
# 'iteration-time' (seconds); Megatron-DeepSpeed puts the same under a group ('lm-loss-training/lm loss').
TRAINING_LOSS = ("lm loss", "lm-loss-training/lm loss")
VALIDATION_LOSS = ("lm loss validation", "lm-loss-validation/lm loss validation")
# Both also log the validation loss with consumed samples as the step: the x-axis of the report's curves.
VALIDATION_LOSS_BY_SAMPLES = ("lm loss validation vs samples", "lm-loss-validation/lm loss validation vs samples")
ITERATION_TIME = ("iteration-time", "iteration-time/iteration-time")

# Megatron's tfevents of a long run are megabytes; a file larger than this is not one, and reading it
# whole for a status line would stall `mlrepro status`.
MAX_FILE_BYTES = 1 << 30
# A written curve's tag for Megatron's training loss, as Megatron-LM names it.
TRAINING_LOSS_TAG = TRAINING_LOSS[0]


def is_event_file(path: Path) -> bool:
    """TensorBoard's own test (a name holding 'tfevents'), which `tensorboard --logdir` also applies."""
    return "tfevents" in path.name


@dataclasses.dataclass(frozen=True)
class Scalars:
    """The scalar series of a folder's (or a file's) event files, and the files or parts of them not read."""

    series: dict[str, list[tuple[int, float]]]
    files: list[str]
    skipped: list[str]  # "<file>: <why>"
    # tag -> step -> the event's wall clock (seconds since the epoch): when a point was written, which times a
    # validation of a trainer whose log lines carry no timestamp (Megatron-DeepSpeed's)
    wall_times: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)

    def first(self, tags: Iterable[str]) -> tuple[str, list[tuple[int, float]]] | None:
        """The first of `tags` (the trainers' names for one quantity) that has points: (tag, points)."""
        for tag in tags:
            if self.series.get(tag):
                return tag, self.series[tag]
        return None

    def points(self, tags: Iterable[str]) -> list[tuple[int, float]]:
        found = self.first(tags)
        return found[1] if found else []


def event_files(where: str | os.PathLike) -> list[Path]:
    """A folder's event files, in the order TensorBoard reads them (by name: the writer's start time leads it),
    or the one file given."""
    where = Path(where)
    if not where.is_dir():
        return [where] if where.exists() else []
    try:
        return sorted(p for p in where.iterdir() if is_event_file(p))
    except OSError:
        return []


def read_scalars(where: str | os.PathLike) -> Scalars:
    """Every scalar in the event files of `where` (a folder, or one file). Never raises on a file's content.

    A step logged again (a resumed run's segment trains the steps after its checkpoint again) replaces
    what the earlier file said from that step on, as TensorBoard's own purge of orphaned data does."""
    series: dict[str, list[tuple[int, float]]] = {}
    walls: dict[str, dict[int, float]] = {}
    files, skipped = [], []
    for path in event_files(where):
        why = _read_file(path, series, walls)
        files.append(str(path))
        if why:
            skipped.append(f"{path}: {why}")
    return Scalars(series=series, files=files, skipped=skipped, wall_times=walls)


def _read_file(path: Path, series: dict[str, list[tuple[int, float]]], walls: dict[str, dict[int, float]]) -> str | None:
    """Add one file's scalars to `series`; returns why it (or its end) was not read, None when all was."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"not readable ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):  # a FIFO named like an event file would block the reader forever
        return "not a regular file"
    if st.st_size > MAX_FILE_BYTES:
        return f"{st.st_size:,} bytes: larger than any trainer's event file ({MAX_FILE_BYTES:,}); not read"
    # tensorboard's readers, imported by the callers that read event files only (protobuf, numpy).
    from tensorboard import data_compat
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    consumed = 0
    try:
        for record in event_file_loader.RawEventFileLoader(str(path)).Load():
            event = data_compat.migrate_event(event_pb2.Event.FromString(record))
            if event.HasField("summary"):
                for value in event.summary.value:
                    if _add(series, value.tag, event.step, _scalar(value)):
                        walls.setdefault(value.tag, {})[int(event.step)] = event.wall_time
            consumed += len(record) + 16  # the record's frame: length (8), its CRC (4), data, the data's CRC (4)
    except Exception as exc:  # any bytes at all: a bad record (a huge length, a proto that is no Event) ends the file, never the caller
        return f"unreadable after {consumed:,} bytes ({type(exc).__name__}: {str(exc)[:200]})"
    if consumed == 0 and st.st_size:
        return "no readable record: not an event file, or corrupt from its first byte"
    if consumed < st.st_size:
        # tensorboard's loader stops quietly at a record it cannot read (truncated, or failing its CRC).
        return (f"{st.st_size - consumed:,} bytes after the first {consumed:,} are not a whole record "
                f"(truncated or corrupt); the records before them are read")
    return None


def _scalar(value) -> float | None:
    """A summary value's number when it is a scalar (v1's simple_value, migrated by data_compat, or a
    scalars-plugin tensor); None for anything else (histograms, images, text)."""
    from tensorboard.plugins.scalar import metadata
    from tensorboard.util import tensor_util

    if value.metadata.plugin_data.plugin_name != metadata.PLUGIN_NAME or not value.HasField("tensor"):
        return None
    array = tensor_util.make_ndarray(value.tensor)
    if array.size != 1 or array.dtype.kind not in "biuf":
        return None
    return float(array.reshape(()))


def _add(series: dict[str, list[tuple[int, float]]], tag: str, step: int, value: float | None) -> bool:
    """Add a point (False: not a scalar); a step at or before the last replaces the points from it on."""
    if value is None:
        return False
    points = series.setdefault(tag, [])
    if points and step <= points[-1][0]:
        points[:] = [p for p in points if p[0] < step]
    points.append((int(step), value))
    return True


# ---------------------------------------------------------------- a trainer's losses


@dataclasses.dataclass(frozen=True)
class TrainerCurves:
    """What the report and `mlrepro status` take from a trainer's event files."""

    training: list[tuple[int, float]]  # (iteration, training loss)
    validation: list[tuple[int, float]]  # (iteration, validation loss)
    validation_by_samples: list[tuple[int, float]]  # (consumed samples, validation loss)
    iteration_time: list[tuple[int, float]]  # (iteration, seconds)
    skipped: list[str]

    @property
    def empty(self) -> bool:
        return not (self.training or self.validation or self.validation_by_samples)


def trainer_curves(folder: str | os.PathLike) -> TrainerCurves | None:
    """The loss series of the event files a trainer wrote into `folder`; None when it holds none (the
    callers then read the log)."""
    if not event_files(folder):
        return None
    s = read_scalars(folder)
    return TrainerCurves(training=s.points(TRAINING_LOSS), validation=s.points(VALIDATION_LOSS),
                         validation_by_samples=s.points(VALIDATION_LOSS_BY_SAMPLES),
                         iteration_time=s.points(ITERATION_TIME), skipped=s.skipped)


def validation_vs_samples(curves: TrainerCurves, global_batch_size: float | None) -> list[tuple[float, float]]:
    """The validation loss against consumed samples: as logged, else iterations x the global batch size."""
    if curves.validation_by_samples:
        return [(float(s), v) for s, v in curves.validation_by_samples]
    if curves.validation and global_batch_size:
        return [(float(i * global_batch_size), v) for i, v in curves.validation]
    return []


# ---------------------------------------------------------------- a scored seed's curve


def eval_tag(metric: str) -> str:
    """The tag of a seed's scored metric: its name and its axis, as Megatron-LM names its 'vs samples' series."""
    return f"{metric} vs samples"


def scored_series(run: dict, metric: str) -> dict[str, list[tuple[int, float]]]:
    """A run record's curves as tag -> [(step, value)]: the evaluations of `metric` by samples and, for a
    Megatron log, its training loss by iteration. Points without a number are left out."""
    out = {}
    for tag, key in ((eval_tag(metric), "evals"), (TRAINING_LOSS_TAG, "curve")):
        points = [(int(p[0]), float(p[1])) for p in run.get(key) or []
                  if isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0]) and _number(p[1])]
        if points:
            out[tag] = points
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def write_scalars(folder: str | os.PathLike, series: dict[str, Sequence[tuple[int, float]]],
                  wall_time: float | None = None) -> Path:
    """`series` (tag -> [(step, value)]) as one event file in `folder`, which it replaces whole (written
    beside it, then renamed). Values are kept as float64 tensors of the scalars plugin: the file reads back
    equal to what was written (v1's simple_value would round to float32)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    import numpy as np

    folder = Path(folder)
    stamp = time.time() if wall_time is None else wall_time  # TensorBoard's relative axis counts from the first
    described = metadata.create_summary_metadata(display_name=None, description="")
    with atomic_dir(folder, keep_on_error=False) as tmp:
        writer = EventFileWriter(str(tmp), max_queue_size=1 << 16)
        try:
            for tag, points in series.items():
                for step, value in points:
                    summary = summary_pb2.Summary()
                    summary.value.add(tag=tag, metadata=described,
                                      tensor=tensor_util.make_tensor_proto(np.float64(value)))
                    writer.add_event(event_pb2.Event(wall_time=stamp, step=int(step), summary=summary))
        finally:
            writer.close()
    return folder
