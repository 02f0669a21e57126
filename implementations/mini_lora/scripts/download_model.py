#!/usr/bin/env python3
"""Produce the mini_lora base checkpoint (the Llama 2 70B download step in miniature).

By default the checkpoint is made honestly rather than downloaded: a tiny
Llama-architecture model is pretrained for a few seconds on plain documents of
the synthetic language (the pretraining workload in miniature). It has never
seen a summary; learning to write one is the fine-tune's job.

With --source the checkpoint is fetched instead: from a local folder (copied),
or from an http(s) URL base that serves manifest.json plus the files it lists
(each checked against its sha256).

Either way DIR ends up holding config.json, model.safetensors and manifest.json
(files, sizes, sha256). Everything is written into a temporary sibling folder
and renamed into place, so an interrupted run never leaves a DIR that looks done.

Usage: download_model.py --model-dir DIR [--source PATH_OR_URL] [--seed N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MANIFEST = "manifest.json"

# Small enough to pretrain in seconds on two cores, large enough that LoRA
# (rank 16 on q/k/v/o) has real work to do.
MODEL_SHAPE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
)
PRETRAIN_DOCS = 8000
PRETRAIN_STEPS = 300
PRETRAIN_BATCH = 32
PRETRAIN_LR = 3e-3


class ModelError(Exception):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, produced_by: dict) -> None:
    files = [
        {"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    ]
    (folder / MANIFEST).write_text(json.dumps({"files": files, "produced_by": produced_by}, indent=2) + "\n")


def pretrain(out: Path, seed: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    import synthetic_language as lang

    # One thread keeps the result identical across machines with different core counts.
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=lang.VOCAB_SIZE,
        max_position_embeddings=64,
        bos_token_id=lang.BOS,
        eos_token_id=lang.EOS,
        pad_token_id=lang.PAD,
        tie_word_embeddings=False,
        **MODEL_SHAPE,
    )
    model = LlamaForCausalLM(config)
    corpus = torch.from_numpy(lang.pretraining_corpus(PRETRAIN_DOCS, seed=1_000_000 + seed))
    labels_all = corpus.masked_fill(corpus == lang.PAD, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / PRETRAIN_STEPS))
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.monotonic()
    loss = torch.tensor(float("nan"))
    for step in range(PRETRAIN_STEPS):
        idx = torch.randint(0, len(corpus), (PRETRAIN_BATCH,), generator=gen)
        loss = model(input_ids=corpus[idx], labels=labels_all[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.save_pretrained(out, safe_serialization=True)
    return {
        "method": "pretraining",
        "seed": seed,
        "steps": PRETRAIN_STEPS,
        "batch": PRETRAIN_BATCH,
        "final_loss": round(loss.item(), 4),
        "seconds": round(time.monotonic() - t0, 1),
    }


def copy_local(source: Path, out: Path) -> dict:
    if not source.is_dir():
        raise ModelError(f"--source {source} is not a folder")
    for name in ("config.json",):
        if not (source / name).is_file():
            raise ModelError(f"--source {source} has no {name}; not a saved model folder")
    for p in source.iterdir():
        if p.name == MANIFEST or p.name.startswith("."):
            continue
        if p.is_dir():
            shutil.copytree(p, out / p.name)
        else:
            shutil.copy2(p, out / p.name)
    return {"method": "copy", "source": str(source.resolve())}


def _fetch(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as fh:
            shutil.copyfileobj(resp, fh, 1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        raise ModelError(f"cannot download {url}: {exc}") from exc


def download(base_url: str, out: Path) -> dict:
    base = base_url if base_url.endswith("/") else base_url + "/"
    _fetch(urllib.parse.urljoin(base, MANIFEST), out / ".remote_manifest.json")
    try:
        remote = json.loads((out / ".remote_manifest.json").read_text())
        files = remote["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{base}{MANIFEST} is not a manifest with a 'files' list: {exc}") from exc
    finally:
        (out / ".remote_manifest.json").unlink(missing_ok=True)
    for entry in files:
        rel = str(entry.get("path", ""))
        if not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise ModelError(f"{base}{MANIFEST} lists an unsafe path {rel!r}")
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        _fetch(urllib.parse.urljoin(base, urllib.parse.quote(rel)), dest)
        if "sha256" in entry and sha256_file(dest) != entry["sha256"]:
            raise ModelError(f"{base}{rel}: sha256 does not match the manifest")
    if not (out / "config.json").is_file():
        raise ModelError(f"{base} served no config.json; not a saved model")
    return {"method": "download", "source": base}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", "--model_dir", required=True, type=Path, help="folder to create")
    parser.add_argument("--source", help="local folder or http(s) URL base to fetch the checkpoint from instead of pretraining")
    parser.add_argument("--seed", type=int, default=0, help="pretraining seed (default 0)")
    args = parser.parse_args(argv)

    target = args.model_dir.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        if args.source is None:
            produced_by = pretrain(tmp, args.seed)
        elif urllib.parse.urlparse(args.source).scheme in ("http", "https"):
            produced_by = download(args.source, tmp)
        else:
            produced_by = copy_local(Path(args.source), tmp)
        write_manifest(tmp, produced_by)
        # mkdtemp makes an owner-only folder; the checkpoint gets the modes the caller's umask gives
        # (the workflow's keeps its files to the user; a plain shell's lets containers read them).
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        for p in tmp.rglob("*"):
            p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except ModelError as exc:
        print(f"download_model: {exc}", file=sys.stderr)
        return 1
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {target}: {json.dumps(produced_by)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
