"""Megatron-DeepSpeed's training log and TensorBoard events, read into megatron_log's TrainingLog.

Its training_log line (megatron/training.py) is Megatron-LM's older one with more fields and no time
stamp: ` iteration N/ M | consumed samples: | consumed tokens: | elapsed time per iteration (ms): |
learning rate: | global batch size: | lm loss: | ... | samples per second: | tokens per gpu per second
(tgs): | TFLOPs: |`. megatron_log parses what the two share; this adds the rest:

- time: a line's time is the training clock, the `[before the start of training step] datetime:` stamp
  plus the logged iteration times since (evaluation and saves left out); where the run's tfevents are
  given, a validation's time is its event's wall clock instead, measured from the first training event.
- the fork's own TFLOPs (`logged_tflops_per_gpu`): kept for reference only; the score counts FLOPs
  as the Megatron-LM kind does (the caller's model FLOPs).
- validations: also the one after the last iteration (`validation loss at iteration N on K-sample draw
  from validation set`), and the tfevents' `lm-loss-validation/lm loss validation` where the log has none.

The tfevents reader is the TFRecord framing and the three protobuf fields a scalar needs (standard
library only: the scorer runs where TensorBoard is not installed).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import struct
from datetime import datetime, timedelta
from pathlib import Path

from mlrepro.scoring import megatron_log, megatron_score
from mlrepro.scoring.megatron_log import TrainingLog, Validation
from mlrepro.scoring.records import RunRecord

TRAIN_TAG = "lm-loss-training/lm loss"
VALID_TAG = "lm-loss-validation/lm loss validation"
ITER_TIME_TAG = "iteration-time/iteration-time"

# megatron_log's patterns for what the two dialects share (its own are private to it).
_PREFIX = re.compile(r"^(?:\s*\d+:\s)?")  # srun -l
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"\[before the start of training step\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_ITER_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([-+0-9.eE]+)")
_LM_LOSS_VALUE = re.compile(r"lm loss value:\s*([-+0-9.eE]+)")
_DS_FIELD = re.compile(r"\|\s*(consumed tokens|samples per second|tokens per gpu per second \(tgs\)|TFLOPs):\s*([-+0-9.eE]+)")
_FINAL_VALID = re.compile(r"validation loss at iteration (\d+) on \d+-sample draw from validation set\s*\|(.*)")


@dataclasses.dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    wall_time: float
    value: float


@dataclasses.dataclass
class DeepSpeedLog:
    log: TrainingLog
    consumed_tokens: dict[int, float]  # iteration -> consumed tokens
    logged_tflops_per_gpu: dict[int, float]  # iteration -> the fork's own TFLOPs (not the score's count)
    samples_per_s: dict[int, float]
    time_source: str  # "training clock" | "tfevents wall clock" | "none"


def parse_lines(lines) -> DeepSpeedLog:
    lines = list(lines)
    log = megatron_log.parse_lines(lines)
    tokens, tflops, sps = {}, {}, {}
    clock, prev, finals = None, 0, []
    times = {}
    for raw in lines:
        line = _PREFIX.sub("", _ANSI.sub("", raw.rstrip("\n")), count=1)
        if m := _START.search(line):
            clock = _datetime(m.group(1))
            continue
        if m := _ITER.search(line):
            it = int(m.group(1))
            fields = dict(_DS_FIELD.findall(line))
            ms = _ITER_MS.search(line)
            if clock is not None and ms is not None and _float(ms.group(1)) is not None:
                clock += timedelta(milliseconds=float(ms.group(1)) * max(0, it - prev))
                times[it] = clock
            prev = it
            for key, out in (("consumed tokens", tokens), ("TFLOPs", tflops), ("samples per second", sps)):
                if key in fields and (v := _float(fields[key])) is not None:
                    out[it] = v
        elif m := _FINAL_VALID.search(line):
            value = _LM_LOSS_VALUE.search(m.group(2))
            loss = _float(value.group(1)) if value else None
            if loss is not None:
                finals.append(Validation(int(m.group(1)), loss, clock))
    for it in log.iterations:
        it.time = it.time or times.get(it.iteration)
    for v in log.validations:
        v.time = v.time or _time_at(log, v.iteration)
    have = {v.iteration for v in log.validations}
    log.validations += [v for v in finals if v.iteration not in have]
    log.validations.sort(key=lambda v: v.iteration)
    return DeepSpeedLog(log, tokens, tflops, sps, "training clock" if times else "none")


def _float(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _datetime(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _time_at(log: TrainingLog, iteration: int):
    """The time of the last logged iteration at or before `iteration`."""
    before = [i.time for i in log.iterations if i.iteration <= iteration and i.time is not None]
    return before[-1] if before else None


def parse_log(path: str | Path, tfevents: list[Path] | None = None) -> DeepSpeedLog:
    with open(path, encoding="utf-8", errors="replace") as fh:
        parsed = parse_lines(fh)
    scalars = [s for f in tfevents or [] for s in read_scalars(f)]
    return with_tfevents(parsed, scalars) if scalars else parsed


def with_tfevents(parsed: DeepSpeedLog, scalars: list[Scalar]) -> DeepSpeedLog:
    """Validations the log lacks added from the events; every validation's time the events' wall clock,
    counted from the first training event less the logged time of the iterations before it."""
    log = parsed.log
    train = sorted((s for s in scalars if s.tag == TRAIN_TAG), key=lambda s: s.step)
    valid = {s.step: s for s in scalars if s.tag == VALID_TAG}
    have = {v.iteration for v in log.validations}
    log.validations += [Validation(step, s.value, None) for step, s in sorted(valid.items()) if step not in have]
    log.validations.sort(key=lambda v: v.iteration)
    anchor = next((i for i in log.iterations if train and i.iteration == train[0].step and i.time), None)
    if anchor is None:
        for v in log.validations:
            v.time = v.time or _time_at(log, v.iteration)
        return parsed
    for v in log.validations:
        if v.iteration in valid:
            v.time = anchor.time + timedelta(seconds=valid[v.iteration].wall_time - train[0].wall_time)
    return dataclasses.replace(parsed, time_source="tfevents wall clock")


# ------------------------------------------------------------------ tfevents

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = out = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: ints, 8/4-byte raw, or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not expected in a tfevents Event")
        yield number, wire, value


def read_scalars(path: str | Path) -> list[Scalar]:
    """Every simple_value scalar of a tfevents file (torch's SummaryWriter.add_scalar writes these):
    Event{1: wall_time double, 2: step int64, 5: Summary{1: Value{1: tag, 2: simple_value float}}}.
    A file cut short (a run killed while writing) yields what it holds up to the cut."""
    data = Path(path).read_bytes()
    out, i = [], 0
    while i + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, i)
        record = data[i + 12:i + 12 + length]
        if len(record) < length:
            break
        i += 12 + length + 4
        wall, step, values = 0.0, 0, []
        for number, _, value in _fields(record):
            if number == 1:
                (wall,) = struct.unpack("<d", value)
            elif number == 2:
                step = value
            elif number == 5:
                values += [v for n, _, v in _fields(value) if n == 1]
        for v in values:
            tag, simple = None, None
            for n, _, x in _fields(v):
                if n == 1:
                    tag = x.decode("utf-8", "replace")
                elif n == 2:
                    (simple,) = struct.unpack("<f", x)
            if tag is not None and simple is not None:
                out.append(Scalar(tag, step, wall, simple))
    return out


def tfevents_files(folder: str | Path) -> list[Path]:
    """The tfevents files under a run's TensorBoard folder, oldest first (a chain writes one per job)."""
    folder = Path(folder)
    return sorted(folder.rglob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []


def training_record(path: str | Path, *, target_loss: float, tfevents: list[Path] | None = None,
                    gpu: str | None = None, gpus: int | None = None, seq_length: int | None = None,
                    model_flops_per_iter: float | None = None, seed: int | None = None,
                    benchmark: str | None = None) -> RunRecord:
    """The run record of a Megatron-DeepSpeed log (megatron_score's, on this dialect's parse): TFLOP/s and
    MFU on `model_flops_per_iter`, the fork's own TFLOPs and the clock used beside them."""
    parsed = parse_log(path, tfevents)
    record = megatron_score.training_record(path, target_loss=target_loss, gpu=gpu, gpus=gpus, seq_length=seq_length,
                                            model_flops_per_iter=model_flops_per_iter, seed=seed,
                                            benchmark=benchmark, log=parsed.log)
    steady = [parsed.logged_tflops_per_gpu[i.iteration] for i in parsed.log.iterations[megatron_score.STEADY_SKIP:]
              if i.iteration in parsed.logged_tflops_per_gpu]
    throughput = {**record.throughput, "logged_tflops_per_gpu": statistics.median(steady) if steady else None,
                  "time_source": parsed.time_source, "tfevents": [str(f) for f in tfevents or []]}
    return record.replace(source="megatron-deepspeed", throughput=throughput)
