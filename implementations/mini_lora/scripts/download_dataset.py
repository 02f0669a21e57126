#!/usr/bin/env python3
"""Produce the mini_lora fine-tuning dataset (the GovReport step in miniature).

No network: the documents and summaries are generated from a fixed synthetic
language (synthetic_language.py), so the same --seed gives the same bytes on any
machine. Output follows the contract of NVIDIA's llama2_70b_lora data folder:

    DIR/train.npy, DIR/validation.npy
        one record per sample with NVIDIA's fields: input_ids (int64, padded),
        loss_mask (int8 0/1, 1 = token is scored), seq_start_id ([0]: one sequence
        per sample). Stored as a plain structured array, not pickled dicts: the
        trainer loads it with allow_pickle=False, so a data file can never run code.

Usage: download_dataset.py --data-dir DIR [--seed N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_language

# The real GovReport split sizes, kept so the miniature logs the same counts.
TRAIN_SAMPLES = 3901
VALIDATION_SAMPLES = 173


def as_records(samples: list[dict]) -> np.ndarray:
    """The samples as a structured array (fields input_ids, loss_mask, seq_start_id)."""
    length = max(len(s["input_ids"]) for s in samples)
    dtype = np.dtype([("input_ids", "<i8", (length,)), ("loss_mask", "i1", (length,)), ("seq_start_id", "<i8", (1,))])
    array = np.zeros(len(samples), dtype=dtype)
    for i, sample in enumerate(samples):
        array["input_ids"][i, : len(sample["input_ids"])] = sample["input_ids"]
        array["loss_mask"][i, : len(sample["loss_mask"])] = sample["loss_mask"]
        array["seq_start_id"][i] = sample["seq_start_id"]
    return array


def save_npy_atomically(path: Path, samples: list[dict]) -> None:
    array = as_records(samples)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, array, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes it 0600; the file gets the mode the caller's umask gives new files.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", "--data_dir", required=True, type=Path, help="folder to write train.npy and validation.npy into")
    parser.add_argument("--seed", type=int, default=0, help="which documents are drawn (default 0)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be >= 0")

    try:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"download_dataset: cannot create {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    # Disjoint streams for the two splits: validation documents are never trained on.
    splits = {"train": (TRAIN_SAMPLES, 2 * args.seed), "validation": (VALIDATION_SAMPLES, 2 * args.seed + 1)}
    for split, (n, seed) in splits.items():
        save_npy_atomically(args.data_dir / f"{split}.npy", synthetic_language.summarization_samples(n, seed))
        print(f"wrote {args.data_dir / (split + '.npy')} ({n} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
