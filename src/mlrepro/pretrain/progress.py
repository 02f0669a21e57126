"""Live progress of a running pretraining seed, read from its log: step, tokens, loss and an ETA.

Two trainers' progress lines are understood: mini_gpt's
    mini_gpt progress: step 120/400 tokens 245760 loss 3.5200 iter_s 0.1300
and Megatron-LM's training log (megatron/training/training.py, training_log):
    iteration      120/     400 | consumed samples: 3840 | elapsed time per iteration (ms): 130.0 | ... lm loss: 3.52E+00 |
(Megatron prints samples, not tokens: tokens are samples x SEQ_LEN when the run's environment
says it). The ETA is the steps left to the last step at the mean of the recent iteration times.
Where the trainer also writes TensorBoard event files into the seed's folder (Megatron-LM's
--tensorboard-dir), the losses come from them: the training loss of every iteration, and the last
validation loss, which the progress lines do not carry.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from mlrepro import paths
from mlrepro.scoring import tfevents

MINI = re.compile(r"progress: step (\d+)/(\d+) tokens (\d+) loss ([-\d.eE+naif]+) iter_s ([\d.eE+-]+)")
MEGATRON = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?consumed samples:\s+(\d+) \|"
                      r".*?elapsed time per iteration \(ms\): ([\d.]+) \|(?:.*?lm loss: ([-\d.eE+]+))?")
RECENT = 5  # progress lines the ETA averages over
STALE_S = 120  # a log untouched for longer is not a run at work (a killed workflow's last attempt)
TAIL_BYTES = 1 << 16


def parse(text: str, seq_len: int | None = None) -> dict | None:
    """The latest progress in a log's text: step, max_steps, tokens, loss, iter_s, eta_s (None if none)."""
    points = []
    for m in MINI.finditer(text):
        points.append((int(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])))
    for m in MEGATRON.finditer(text):
        tokens = int(m[3]) * seq_len if seq_len else None
        points.append((int(m[1]), int(m[2]), tokens, float(m[5]) if m[5] else None, float(m[4]) / 1000))
    if not points:
        return None
    step, max_steps, tokens, loss, _ = points[-1]
    recent = [p[4] for p in points[-RECENT:]]
    iter_s = sum(recent) / len(recent)
    return {"step": step, "max_steps": max_steps, "tokens": tokens, "loss": loss, "iter_s": round(iter_s, 4),
            "eta_s": round(max(0, max_steps - step) * iter_s, 1)}


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - TAIL_BYTES))
        return fh.read().decode(errors="replace")


def live(seed_dir: Path) -> dict | None:
    """The progress of the seed's current attempt (its job.json's logdir), or None."""
    job = paths.read_job(seed_dir)
    if job is None or job.logdir is None or not job.logdir.is_dir():
        return None
    log = paths.AttemptPaths(job.logdir).newest_log()
    if log is None:
        return None
    found = parse(_tail(log))
    if found is not None:
        found["segment"] = job.attempt
        found["age_s"] = round(time.time() - log.stat().st_mtime, 1)
        tb = trainer_losses(seed_dir)
        # The event files are flushed every 2 minutes or so: their training loss stands where it is as recent
        # as the log's (each iteration's, where the log prints every tenth), the log's where it is newer.
        if "loss" in tb and (found["loss"] is None or tb["loss_step"] >= found["step"]):
            found["loss"], found["loss_step"] = tb["loss"], tb["loss_step"]
        found.update({k: tb[k] for k in ("val_loss", "val_step") if k in tb})
    return found


def trainer_losses(seed_dir: Path) -> dict:
    """The latest training and validation losses of the trainer's event files (with their steps); {} where it
    writes none, or they hold no loss yet (the log's loss stands)."""
    curves = tfevents.trainer_curves(paths.SeedPaths(seed_dir).tensorboard)
    out = {}
    if curves is not None and curves.training:
        out["loss_step"], out["loss"] = curves.training[-1]
    if curves is not None and curves.validation:
        out["val_step"], out["val_loss"] = curves.validation[-1]
    return out


def describe(p: dict) -> str:
    """'step 120/400, 245,760 tokens, loss 3.520, ETA 0:36 (0.130 s/step)'."""
    tokens = f", {p['tokens']:,} tokens" if p.get("tokens") is not None else ""
    loss = f", loss {p['loss']:.3f}" if p.get("loss") is not None else ""
    if loss and p.get("loss_step") not in (None, p["step"]):
        loss += f" at step {p['loss_step']}"
    if p.get("val_loss") is not None:
        loss += f", validation loss {p['val_loss']:.3f} at step {p['val_step']}"
    return (f"step {p['step']}/{p['max_steps']}{tokens}{loss}, ETA {format_elapsed(p['eta_s'])} "
            f"({p['iter_s']:.3f} s/step)")


def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
