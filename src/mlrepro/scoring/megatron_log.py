"""Parse Megatron-LM and NeMo pretraining logs (no MLLOG) into iterations, validations and memory.

Megatron-LM's `training_log` prints, every --log-interval iterations, one line of `key: value |`
fields after a `[YYYY-MM-DD HH:MM:SS.ffffff]` stamp (iteration i/N, consumed samples, elapsed time
per iteration (ms), throughput per GPU (TFLOP/s/GPU) with --log-throughput, learning rate, global
batch size, lm loss, grad norm ...); `evaluate_and_print_results` prints `validation loss at
iteration N on validation set | lm loss value: X | lm loss PPL: Y |`; `report_memory` prints
`[Rank r] (after N iterations) memory (MB) | allocated: .. | max allocated: ..`. NeMo (Lightning)
logs the same quantities as `name=value` pairs of its progress bar (reduced_train_loss,
global_step, consumed_samples, train_step_timing in s, val_loss). srun -l prefixes ("0: ") and
ANSI colours are ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import datetime
from pathlib import Path

from mlrepro.scoring.mllog import open_regular

_PREFIX = re.compile(r"^(?:\s*\d+:\s)?")  # srun -l
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9 _/()\-.]*?):\s*([-+0-9.eEnaNifINF]+)\s*\|")
_VALID = re.compile(r"validation(?:-\S+)? loss at iteration (\d+)(?: on validation set)?\s*\|(.*)")
_MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(MB\)\s*\|(.*)")
TRAINING_START = re.compile(r"\[before the start of training step\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
TRAINING_DONE = re.compile(r"\[after training is done\]")
_ARG = re.compile(r"^\s{2}(\w+) \.{3,} (.*?)\s*$")  # the arguments block Megatron prints at start
_NEMO_PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_ ]*?)=([-+0-9.eE]+|nan|inf)(?=[,\]\s])")


def clean_line(raw: str) -> str:
    """A log line as the patterns read it: srun -l's rank prefix and terminal colours taken off."""
    return _PREFIX.sub("", _ANSI.sub("", raw.rstrip("\n")), count=1)


@dataclasses.dataclass
class Iteration:
    iteration: int
    train_iters: int | None
    time: datetime | None
    consumed_samples: float | None
    iter_ms: float | None
    tflops_per_gpu: float | None
    lm_loss: float | None
    global_batch_size: float | None
    learning_rate: float | None = None
    grad_norm: float | None = None
    skipped: int = 0
    nan: int = 0


@dataclasses.dataclass
class Validation:
    iteration: int
    loss: float
    time: datetime | None  # the stamp of the last training line before it (Megatron prints none)


@dataclasses.dataclass
class TrainingLog:
    source: str  # megatron | nemo | none
    iterations: list[Iteration]
    validations: list[Validation]
    max_allocated_mb: float | None = None
    max_reserved_mb: float | None = None
    start: datetime | None = None
    starts: list[datetime] = dataclasses.field(default_factory=list)  # every start of training: more than one, more than one run
    start_after_iteration: int | None = None  # the iteration logged before the (first) start of training, if any
    args: dict[str, str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    # "[after training is done]": the loop ran to --train-iters (Megatron's clock and signal exits leave before
    # it), though the last iteration is logged only where --log-interval divides it
    training_done: bool = False


def _float(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _fields(text: str) -> dict[str, str]:
    return {k.strip().lower(): v for k, v in _FIELD.findall(text + " |")}


def _datetime(text: str) -> datetime | None:
    """A stamp's time; None for one that names no day (a month 13 in an edited log)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _stamp(text: str) -> datetime | None:
    m = _STAMP.search(text)
    return _datetime(m.group(1)) if m else None


def _megatron_iteration(line: str) -> Iteration | None:
    m = ITERATION.search(line)
    if not m:
        return None
    f = _fields(line[m.end():])
    get = lambda *keys: next((_float(f[k]) for k in keys if k in f), None)  # noqa: E731
    return Iteration(
        iteration=int(m.group(1)), train_iters=int(m.group(2)), time=_stamp(line),
        consumed_samples=get("consumed samples"), iter_ms=get("elapsed time per iteration (ms)"),
        tflops_per_gpu=get("throughput per gpu (tflop/s/gpu)"), lm_loss=get("lm loss"),
        global_batch_size=get("global batch size"), learning_rate=get("learning rate"),
        grad_norm=get("grad norm"), skipped=int(get("number of skipped iterations") or 0),
        nan=int(get("number of nan iterations") or 0))


def _nemo_pairs(line: str) -> dict[str, float | None]:
    return {k.strip(): _float(v) for k, v in _NEMO_PAIR.findall(line + ",")}


def parse_lines(lines) -> TrainingLog:
    log = TrainingLog(source="none", iterations=[], validations=[])
    last_time = None
    for raw in lines:
        line = clean_line(raw)
        if m := TRAINING_START.search(line):
            stamp = _datetime(m.group(1))
            if stamp is not None:
                log.starts.append(stamp)
                log.start = log.start or stamp
            if log.iterations and log.start_after_iteration is None:
                log.start_after_iteration = log.iterations[-1].iteration
            continue
        if TRAINING_DONE.search(line):
            log.training_done = True
            continue
        if (m := _ARG.match(line)) and not log.iterations:
            log.args.setdefault(m.group(1), m.group(2))
        elif (it := _megatron_iteration(line)) is not None:
            log.source = "megatron"
            log.iterations.append(it)
            last_time = it.time or last_time
        elif m := _VALID.search(line):
            loss = _float(_fields(m.group(2)).get("lm loss value", "nan"))
            if loss is None:
                log.problems.append(f"validation at iteration {m.group(1)} has no finite lm loss")
            else:
                log.validations.append(Validation(int(m.group(1)), loss, last_time))
        elif m := _MEMORY.search(line):
            f = _fields(m.group(2))
            for key, attr in (("max allocated", "max_allocated_mb"), ("max reserved", "max_reserved_mb")):
                value = _float(f.get(key, "nan"))
                if value is not None:
                    setattr(log, attr, max(value, getattr(log, attr) or 0.0))
        elif "global_step=" in line or "reduced_train_loss=" in line or "val_loss=" in line:
            _nemo_line(log, _nemo_pairs(line))
    return log


def _nemo_line(log: TrainingLog, pairs: dict[str, float | None]) -> None:
    step = pairs.get("global_step")
    if step is None:
        return
    log.source = "nemo" if log.source == "none" else log.source
    step = int(step) + 1  # Lightning counts from 0; Megatron's iteration i is the i-th finished step
    timing = pairs.get("train_step_timing in s")
    if not log.iterations or log.iterations[-1].iteration != step:
        log.iterations.append(Iteration(
            iteration=step, train_iters=None, time=None, consumed_samples=pairs.get("consumed_samples"),
            iter_ms=timing * 1000 if timing is not None else None, tflops_per_gpu=None,
            lm_loss=pairs.get("reduced_train_loss"), global_batch_size=None))
    val = pairs.get("val_loss")
    if val is not None and not any(v.iteration == step for v in log.validations):
        log.validations.append(Validation(step, val, None))


def parse_log(path: str | Path) -> TrainingLog:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse_lines(fh)


_SNIFF = re.compile(rb"\biteration\s+\d+/\s*\d+\s*\|\s*consumed samples|global_step=\d")


def is_training_log(path: str | Path, limit: int = 8 << 20) -> bool:
    """Whether the file holds a Megatron-LM or NeMo training line in its first `limit` bytes (cheap sniff;
    False for anything but a regular file, so a FIFO in a scanned folder cannot hang the scan)."""
    try:
        with open_regular(path) as fh:
            return bool(_SNIFF.search(fh.read(limit)))
    except OSError:
        return False
