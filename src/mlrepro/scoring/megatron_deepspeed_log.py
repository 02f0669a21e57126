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
from datetime import datetime, timedelta
from pathlib import Path

from mlrepro.scoring import megatron_log, megatron_score, tfevents
from mlrepro.scoring.megatron_log import TrainingLog, Validation
from mlrepro.scoring.records import RunRecord

TRAIN_TAG = "lm-loss-training/lm loss"
VALID_TAG = "lm-loss-validation/lm loss validation"
ITER_TIME_TAG = "iteration-time/iteration-time"

# What the two dialects share is megatron_log's (clean_line, ITERATION, TRAINING_START); these are this fork's own.
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
        line = megatron_log.clean_line(raw)
        if m := megatron_log.TRAINING_START.search(line):
            clock = _datetime(m.group(1))
            continue
        if m := megatron_log.ITERATION.search(line):
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
    anchored on the first logged iteration that has a training event (the fork writes one every iteration,
    the log a line every --log-interval) at its logged time."""
    log = parsed.log
    train = {s.step: s for s in scalars if s.tag == TRAIN_TAG}
    valid = {s.step: s for s in scalars if s.tag == VALID_TAG}
    have = {v.iteration for v in log.validations}
    log.validations += [Validation(step, s.value, None) for step, s in sorted(valid.items()) if step not in have]
    log.validations.sort(key=lambda v: v.iteration)
    anchor = next((i for i in log.iterations if i.iteration in train and i.time), None)
    if anchor is None:
        for v in log.validations:
            v.time = v.time or _time_at(log, v.iteration)
        return parsed
    for v in log.validations:
        if v.iteration in valid:
            v.time = anchor.time + timedelta(seconds=valid[v.iteration].wall_time - train[anchor.iteration].wall_time)
    return dataclasses.replace(parsed, time_source="tfevents wall clock")


# ------------------------------------------------------------------ tfevents

def read_scalars(path: str | Path) -> list[Scalar]:
    """Every scalar of a tfevents file with its step and wall clock, through the one event reader
    (mlrepro.scoring.tfevents: tensorboard's own, which reads a file cut short up to the cut)."""
    found = tfevents.read_scalars(path)
    return [Scalar(tag, step, found.wall_times.get(tag, {}).get(step, 0.0), value)
            for tag, points in found.series.items() for step, value in points]


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
