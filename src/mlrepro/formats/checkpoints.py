"""Checkpoint folders of a pretraining run: atomic save, the last good one, and the retention policy.

A checkpoint is a folder step_<NNNNNNNN>/ under the run's checkpoint folder holding the trainer's
state and meta.json ({"step", "val_loss", ...}); it is written under a temporary name and renamed
into place, so a folder with meta.json is complete. Kept by policy (the NeMo guide keeps the top 10 by
val_loss plus the last): every `keep_every` steps, the last `keep_last`, the best `keep_best` by
validation loss.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")
META = "meta.json"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    val_loss: float | None


def listing(folder: Path) -> list[Checkpoint]:
    """The complete checkpoints under `folder`, oldest step first (half-written ones are skipped)."""
    found = []
    for entry in Path(folder).glob("step_*"):
        m = STEP_DIR.match(entry.name)
        meta = entry / META
        if not m or not meta.is_file():
            continue
        with contextlib.suppress(ValueError, OSError):
            record = json.loads(meta.read_text())
            found.append(Checkpoint(int(m.group(1)), entry, record.get("val_loss")))
    return sorted(found, key=lambda c: c.step)


def latest(folder: Path) -> Checkpoint | None:
    found = listing(folder)
    return found[-1] if found else None


# Megatron-LM's --save folder: iter_<NNNNNNN>/ per checkpoint and this file, which it writes once a
# save is complete (megatron/training/checkpointing.py), naming the last one.
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def latest_step(folder: Path) -> int:
    """The step of the last complete checkpoint in `folder`, ours (step_N/) or Megatron-LM's; 0 for none."""
    last = latest(folder)
    step = last.step if last else 0
    try:
        return max(step, int((Path(folder) / MEGATRON_TRACKER).read_text().strip()))
    except (OSError, ValueError):  # no Megatron checkpoint, or its 'release' marker
        return step


# A checkpoint found unusable is renamed with this prefix (kept for a person to look at, never resumed from).
SET_ASIDE = "bad_"
MEGATRON_ITER = re.compile(r"^iter_(\d+)$")


def problems(checkpoint: Checkpoint) -> list[str]:
    """What is wrong with a complete-looking checkpoint of ours: files its meta.json lists (name -> bytes)
    that are missing or of another size (a truncated copy, a disk that lost the tail)."""
    try:
        listed = json.loads((checkpoint.path / META).read_text()).get("files") or {}
    except (OSError, ValueError):
        return [f"{checkpoint.path / META}: unreadable"]
    found = []
    for name, size in listed.items():
        path = checkpoint.path / name
        try:
            actual = path.stat().st_size
        except OSError:
            found.append(f"{path}: missing")
            continue
        if actual != size:
            found.append(f"{path}: {actual} bytes, {size} written")
    return found


def megatron_iterations(folder: Path) -> list[int]:
    """The iterations of Megatron-LM's checkpoint folders (iter_NNNNNNN/) under `folder`, oldest first."""
    return sorted(int(m.group(1)) for e in Path(folder).glob("iter_*") if (m := MEGATRON_ITER.match(e.name)))


def set_aside(folder: Path, step: int) -> Path | None:
    """Put the checkpoint of `step` out of a resume's way (renamed bad_step_N/ or bad_iter_N/), so that the
    previous one is used; for Megatron-LM the tracker then names the previous iteration (or is removed
    when none is left: the run starts over). The folder set aside, or None when there was none."""
    folder = Path(folder)
    ours = folder / f"step_{step:08d}"
    megatron = folder / f"iter_{step:07d}"
    target = ours if ours.is_dir() else megatron if megatron.is_dir() else None
    if target is None:
        return None
    aside = folder / f"{SET_ASIDE}{target.name}"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    if target is megatron:
        tracker = folder / MEGATRON_TRACKER
        earlier = [i for i in megatron_iterations(folder) if i < step]
        if earlier:
            _write_atomically(tracker, f"{earlier[-1]}\n")
        else:
            tracker.unlink(missing_ok=True)
    return aside


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(folder: Path, step: int, write, meta: dict) -> Path:
    """Write a checkpoint atomically: `write(tmp_dir)` fills a temporary folder that is then renamed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:08d}"
    tmp = folder / f".tmp_step_{step:08d}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    (tmp / META).write_text(json.dumps({"step": step, **meta}))
    for path in tmp.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # a segment that died after this step was saved redoes it identically
        shutil.rmtree(final)
    os.replace(tmp, final)
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return final


def to_keep(found: list[Checkpoint], keep_last: int, keep_best: int, keep_every: int = 0) -> set[int]:
    """The steps the policy keeps: the last `keep_last`, the best `keep_best` by val_loss, every `keep_every`."""
    steps = {c.step for c in found[-keep_last:]} if keep_last > 0 else set()
    scored = sorted((c for c in found if c.val_loss is not None), key=lambda c: (c.val_loss, -c.step))
    steps |= {c.step for c in scored[:keep_best]} if keep_best > 0 else set()
    if keep_every > 0:
        steps |= {c.step for c in found if c.step % keep_every == 0}
    if found:
        steps.add(found[-1].step)  # the one a resume starts from is never removed
    return steps


def prune(folder: Path, keep_last: int, keep_best: int, keep_every: int = 0) -> list[int]:
    """Remove what the policy does not keep (and leftovers of interrupted saves); the removed steps."""
    found = listing(folder)
    keep = to_keep(found, keep_last, keep_best, keep_every)
    removed = []
    for c in found:
        if c.step not in keep:
            shutil.rmtree(c.path, ignore_errors=True)
            removed.append(c.step)
    for tmp in Path(folder).glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)
    return removed
