#!/usr/bin/env python3
"""mini_gpt trainer: a small GPT pretrained from scratch on a Megatron-format corpus blend.

The miniature of the GPT pretraining benchmarks (llama31_405b, the NeMo guide's gpt3 runs): a
decoder-only transformer with random initial weights, trained data-parallel over
torch.distributed ranks on the .bin/.idx datasets of $DATADIR/data_prefix.json (blended by its
weights as Megatron's BlendedDataset does), until the validation loss reaches the target.
MLLOG lines (mlperf_logging.mllog, llama31_405b's keys) go to stdout from rank 0 only.

Time-limited jobs: with JOB_SECONDS set the run stops MARGIN_SECONDS before that limit (its own
max-time, as NeMo's), or on SIGUSR1 (Slurm's --signal), writes a checkpoint into CHECKPOINT_DIR
and exits 0 without run_stop, printing `mini_gpt segment: {...}`; started again it resumes from
the last complete checkpoint. The MLLOG clock counts training time only: a resumed run re-prints
the log up to its checkpoint and goes on from the checkpoint's clock, so run_stop - run_start is
the sum of the segments' training time. The run is deterministic (fixed data order by step, no
dropout, one thread per rank), so a chained run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

ENVIRONMENT = """\
required: DATADIR (holds data_prefix.json), SEED
optional: MAX_STEPS (3000), LR (0.003), MINIBS (16, per rank), SEQ_LEN (64), N_LAYER (2), N_EMBD (64),
          N_HEAD (4), TARGET_EVAL_LOSS, EVAL_EVERY (20), EVAL_SAMPLES (256), WARMUP_STEPS (20),
          CHECKPOINT_DIR (none: no checkpoints), CKPT_EVERY (steps, 40), KEEP_LAST (2), KEEP_BEST (10),
          JOB_SECONDS (none), MARGIN_SECONDS (0), MAX_MINUTES, TORCH_NUM_THREADS, SUBMISSION_*"""


class UsageError(Exception):
    """A setting the user controls is missing or wrong; reported without a traceback."""


def _env(name: str, default, kind=str):
    raw = os.environ.get(name, "")
    if raw == "":
        if default is None:
            raise UsageError(f"required environment variable {name} is not set\n{ENVIRONMENT}")
        return default
    try:
        return kind(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}={raw!r} is not a valid {kind.__name__}") from None


class Settings:
    def __init__(self) -> None:
        self.data_dir = Path(_env("DATADIR", None))
        self.seed = _env("SEED", None, int)
        self.max_steps = _env("MAX_STEPS", 3000, int)
        self.lr = _env("LR", 0.003, float)
        self.minibs = _env("MINIBS", 16, int)
        self.seq = _env("SEQ_LEN", 64, int)
        self.n_layer = _env("N_LAYER", 2, int)
        self.n_embd = _env("N_EMBD", 64, int)
        self.n_head = _env("N_HEAD", 4, int)
        self.target = _env("TARGET_EVAL_LOSS", 4.0, float)
        self.eval_every = _env("EVAL_EVERY", 20, int)
        self.eval_samples = _env("EVAL_SAMPLES", 256, int)
        self.warmup = _env("WARMUP_STEPS", 20, int)
        self.ckpt_dir = Path(os.environ["CHECKPOINT_DIR"]) if os.environ.get("CHECKPOINT_DIR") else None
        self.ckpt_every = _env("CKPT_EVERY", 40, int)
        self.keep_last = _env("KEEP_LAST", 2, int)
        self.keep_best = _env("KEEP_BEST", 10, int)
        self.job_seconds = _env("JOB_SECONDS", 0.0, float)
        self.margin = _env("MARGIN_SECONDS", 0.0, float)
        self.max_minutes = _env("MAX_MINUTES", _env("WALLTIME_RUNANDTIME", 10.0, float), float)
        self.benchmark = _env("SUBMISSION_BENCHMARK", "mini_gpt")
        self.org = _env("SUBMISSION_ORG", "mlrepro")
        self.division = _env("SUBMISSION_DIVISION", "closed")
        self.status = _env("SUBMISSION_STATUS", "onprem")
        self.platform = _env("SUBMISSION_PLATFORM", _env("DGXSYSTEM", "CPU"))
        for name in ("TP", "PP", "CP"):
            if _env(name, 1, int) != 1:
                raise UsageError(f"{name}={os.environ[name]}: mini_gpt is data-parallel only (use a tp1pp1cp1 config)")
        for name in ("max_steps", "minibs", "seq", "n_layer", "n_embd", "n_head", "eval_every", "eval_samples",
                     "ckpt_every"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name.upper()}={getattr(self, name)} must be at least 1")
        if self.n_embd % self.n_head:
            raise UsageError(f"N_EMBD={self.n_embd} is not a multiple of N_HEAD={self.n_head}")
        if self.job_seconds and self.ckpt_dir is None:
            raise UsageError("JOB_SECONDS is set but CHECKPOINT_DIR is not: a time-limited job must checkpoint")
        if self.job_seconds and self.margin >= self.job_seconds:
            raise UsageError(f"MARGIN_SECONDS={self.margin} leaves no time in JOB_SECONDS={self.job_seconds}")


# ---------------------------------------------------------------- data


# Megatron's indexed dataset, as megatron/core/datasets/indexed_dataset.py writes it: the .idx holds
# the 9-byte magic, u64 version 1, a u8 dtype code, u64 sequence and document counts, then the
# int32 sequence lengths (pointers and document indices follow); the .bin holds the token ids back
# to back. The trainer needs every token in order, so it reads the header and the lengths and maps
# the .bin. Its own reader, not megatron-core's IndexedDataset: importing that takes seconds per rank
# and all of megatron.core, and a trainer imports nothing from mlrepro.
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def read_tokens(prefix: Path):
    """Every token id of the Megatron dataset `prefix` (.bin/.idx), in order, as a read-only memmap."""
    import struct

    import numpy as np

    idx, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    for path in (idx, bin_path):
        if not path.is_file():  # missing, or a FIFO whose open would wait forever
            raise UsageError(f"{path}: not a regular file")
    with open(idx, "rb") as fh:
        head = fh.read(34)
        if len(head) < 34:
            raise UsageError(f"{idx}: {len(head)} bytes, shorter than a Megatron index header (truncated?)")
        if head[:9] != INDEX_MAGIC:
            raise UsageError(f"{idx}: not a Megatron index (magic {head[:9]!r})")
        version, code, sequences = struct.unpack_from("<QBQ", head, 9)
        if version != 1 or code not in INDEX_DTYPES:
            raise UsageError(f"{idx}: version {version}, dtype code {code}: not a Megatron index this trainer reads")
        lengths = np.fromfile(fh, "<i4", sequences)
    if len(lengths) != sequences or (len(lengths) and int(lengths.min()) < 0):
        raise UsageError(f"{idx}: {sequences} sequences, but {len(lengths)} lengths, or a negative one (truncated?)")
    dtype = np.dtype(INDEX_DTYPES[code])
    size = int(lengths.astype(np.int64).sum()) * dtype.itemsize
    if len(lengths) != sequences or bin_path.stat().st_size != size:
        raise UsageError(f"{bin_path}: {bin_path.stat().st_size} bytes, its index describes {size}")
    return np.memmap(bin_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)


def load_blend(data_dir: Path, seq: int, eval_samples: int):
    """(train, validation, weights) from data_prefix.json: per dataset, windows of seq+1 tokens.

    The last windows of each dataset, in proportion to its weight, are the validation set, the same
    for every seed; the rest are the training samples.
    """
    import numpy as np

    blend_file = data_dir / "data_prefix.json"
    if not blend_file.is_file():
        raise UsageError(f"DATADIR={data_dir} has no data_prefix.json (run the corpus stages)")
    prefix = json.loads(blend_file.read_text())["data_prefix"]
    weights = [float(w) for w in prefix[::2]]
    total = sum(weights)
    train, val = [], []
    for weight, name in zip(weights, prefix[1::2]):
        path = Path(name) if Path(name).is_absolute() else data_dir / "preprocessed" / Path(name).name
        tokens = np.asarray(read_tokens(path), dtype=np.int64)
        windows = tokens[: len(tokens) // (seq + 1) * (seq + 1)].reshape(-1, seq + 1)
        n_val = max(1, round(eval_samples * weight / total))
        if len(windows) <= n_val:
            raise UsageError(f"{path}: {len(windows)} samples of {seq + 1} tokens, too few for {n_val} validation ones")
        train.append(windows[:-n_val])
        val.append(windows[-n_val:])
    return train, np.concatenate(val), [w / total for w in weights]


def blending_indices(weights: list[float], size: int):
    """Which dataset each of `size` samples comes from: the most under-served one, as Megatron's
    build_blending_indices picks (deterministic, follows the weights exactly over any prefix)."""
    import numpy as np

    counts = np.zeros(len(weights))
    out = np.empty(size, dtype=np.int64)
    w = np.asarray(weights)
    for i in range(size):
        pick = int(np.argmax(w * (i + 1) - counts))
        out[i] = pick
        counts[pick] += 1
    return out


# ---------------------------------------------------------------- model


def build_model(s: Settings, vocab: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(s.n_embd), nn.LayerNorm(s.n_embd)
            self.qkv, self.proj = nn.Linear(s.n_embd, 3 * s.n_embd), nn.Linear(s.n_embd, s.n_embd)
            self.mlp = nn.Sequential(nn.Linear(s.n_embd, 4 * s.n_embd), nn.GELU(), nn.Linear(4 * s.n_embd, s.n_embd))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, s.n_head, c // s.n_head).permute(2, 0, 3, 1, 4)
            att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, s.n_embd), nn.Embedding(s.seq, s.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(s.n_layer))
            self.ln_f = nn.LayerNorm(s.n_embd)
            self.head = nn.Linear(s.n_embd, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied, as GPT-2
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(s.seed)
    return GPT()


# ---------------------------------------------------------------- MLLOG with a training-time clock


class Mllog:
    """MLLOG from rank 0 on a clock that counts training time only; the lines are kept, so that a
    checkpoint carries the log up to it and a resumed segment can print it again first."""

    def __init__(self, rank: int, start_ms: int, offset_s: float, history: list[str]):
        from mlperf_logging import mllog

        self.rank, self.lines = rank, list(history)
        self.start_ms, self.offset_s, self.t0 = start_ms, offset_s, time.monotonic()
        self.logger = mllog.get_mllogger()
        mllog.config(default_stack_offset=3, root_dir=os.path.dirname(os.path.abspath(__file__)))
        lines = self.lines

        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(record.getMessage())

        self.logger.logger.addHandler(Keep())

    def clock_s(self) -> float:
        return self.offset_s + time.monotonic() - self.t0

    def __call__(self, kind: str, key: str, value=None, **metadata) -> None:
        if self.rank == 0:
            getattr(self.logger, kind)(key=key, value=value, metadata=metadata or None,
                                       time_ms=self.start_ms + int(1000 * self.clock_s()))
            sys.stdout.flush()


# ---------------------------------------------------------------- checkpoint folders


# A checkpoint is <CHECKPOINT_DIR>/step_<NNNNNNNN>/ with state.pt and meta.json ({"step", "val_loss",
# ...}), written under a temporary name and renamed into place: a folder with meta.json is complete.
# mlrepro's chain of segments reads the same folders (mlrepro.formats.checkpoints) to see how far a
# seed got; this trainer writes them with its own code, as it imports nothing from mlrepro.
STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints(folder: Path) -> list[tuple[int, Path, float | None]]:
    """(step, folder, val_loss) of each complete checkpoint, oldest first."""
    found = []
    for entry in Path(folder).glob("step_*"):
        m = STEP_DIR.match(entry.name)
        if m and (entry / "meta.json").is_file():
            try:
                found.append((int(m.group(1)), entry, json.loads((entry / "meta.json").read_text()).get("val_loss")))
            except (ValueError, OSError):
                continue
    return sorted(found, key=lambda c: c[0])


def save_checkpoint(folder: Path, step: int, write, meta: dict) -> Path:
    """`write(tmp)` fills a temporary folder; meta.json is added, everything synced, then it is renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    final, tmp = folder / f"step_{step:08d}", folder / f".tmp_step_{step:08d}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    # The sizes written, so that a copy truncated later is found before a resume trusts it.
    files = {p.name: p.stat().st_size for p in tmp.iterdir()}
    (tmp / "meta.json").write_text(json.dumps({"step": step, **meta, "files": files}))
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


def prune_checkpoints(folder: Path, keep_last: int, keep_best: int) -> None:
    """Keep the last `keep_last` and the best `keep_best` by validation loss (the NeMo guide keeps the top 10
    by val_loss plus the last), never the newest; remove the rest and leftovers of interrupted saves."""
    found = checkpoints(folder)
    keep = {c[0] for c in found[-keep_last:]} if keep_last > 0 else set()
    scored = sorted((c for c in found if c[2] is not None), key=lambda c: (c[2], -c[0]))
    keep |= {c[0] for c in scored[:keep_best]} if keep_best > 0 else set()
    if found:
        keep.add(found[-1][0])  # the one a resume starts from
    for step, path, _ in found:
        if step not in keep:
            shutil.rmtree(path, ignore_errors=True)
    for tmp in folder.glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- training


def log_hyperparameters(log: Mllog, s: Settings, gbs: int, train_samples: int) -> None:
    from mlperf_logging.mllog import constants as C

    for key, value in ((C.SUBMISSION_BENCHMARK, s.benchmark), (C.SUBMISSION_ORG, s.org),
                       (C.SUBMISSION_DIVISION, s.division), (C.SUBMISSION_STATUS, s.status),
                       (C.SUBMISSION_PLATFORM, s.platform), (C.SEED, s.seed), (C.GLOBAL_BATCH_SIZE, gbs),
                       (C.MAX_SEQUENCE_LENGTH, s.seq), (C.OPT_NAME, "adamw"), (C.OPT_BASE_LR, s.lr),
                       (C.OPT_END_LR, s.lr * 0.1), (C.OPT_LR_DECAY_STEPS, s.max_steps - s.warmup),
                       (C.OPT_LR_WARMUP_STEPS, s.warmup), (C.OPT_LR_DECAY_SCHEDULE, "cosine with linear warmup"),
                       (C.OPT_ADAMW_BETA_1, 0.9), (C.OPT_ADAMW_BETA_2, 0.95), (C.OPT_ADAMW_EPSILON, 1e-05),
                       (C.OPT_ADAMW_WEIGHT_DECAY, 0.1), (C.OPT_GRADIENT_CLIP_NORM, 1.0),
                       (C.GRADIENT_ACCUMULATION_STEPS, 1), (C.TRAIN_SAMPLES, train_samples),
                       (C.EVAL_SAMPLES, s.eval_samples), (C.INIT_CHECKPOINT_STEP, 0), (C.MAX_STEPS, s.max_steps)):
        log("event", key, value)


class Stopper:
    """Why this segment should stop: its job's limit minus the margin, or SIGUSR1 (Slurm --signal)."""

    def __init__(self, s: Settings):
        self.deadline = time.monotonic() + s.job_seconds - s.margin if s.job_seconds else None
        self.signalled = False
        signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, *_):
        self.signalled = True

    def due(self) -> bool:
        return self.signalled or (self.deadline is not None and time.monotonic() >= self.deadline)


def lr_at(s: Settings, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of LR at MAX_STEPS."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = min(1.0, (step - s.warmup) / max(1, s.max_steps - s.warmup))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def setup_distributed():
    """(rank, world, device, distributed) from torchrun's or srun's environment."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS") or 1))
    torch.use_deterministic_algorithms(True, warn_only=True)
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return rank, world, device, dist.is_initialized()


class Run:
    """The model, optimizer and data of one run, and its step, evaluation and checkpoint."""

    def __init__(self, s: Settings, rank: int, world: int, device, distributed: bool):
        import torch

        self.s, self.rank, self.world, self.device, self.distributed = s, rank, world, device, distributed
        self.train, self.val, weights = load_blend(s.data_dir, s.seq, s.eval_samples)
        self.vocab = int(max(int(self.val.max()), *(int(t.max()) for t in self.train))) + 1
        self.model = build_model(s, self.vocab).to(device)
        self.gbs = s.minibs * world
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=s.lr, betas=(0.9, 0.95), eps=1e-5)
        self.params = list(self.model.parameters())
        self.source = blending_indices(weights, self.gbs)  # the blend of every global batch
        self.step, self.eval_loss = 0, None

    def batch_for(self, step: int):
        import numpy as np
        import torch

        # The global batch depends on SEED and the step only: the same whatever the ranks or segments.
        gen = np.random.default_rng([self.s.seed, step])
        rows = [self.train[d][gen.integers(len(self.train[d]))] for d in self.source]
        mine = np.stack(rows[self.rank * self.s.minibs:(self.rank + 1) * self.s.minibs])
        return torch.from_numpy(mine).to(self.device)

    def train_step(self, votes: list[float]) -> tuple[float, list[float]]:
        """One optimizer step; the mean loss over ranks and the sums of every rank's `votes`."""
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.s, self.step)
        ids = self.batch_for(self.step)
        loss = F.cross_entropy(self.model(ids[:, :-1]).reshape(-1, self.vocab), ids[:, 1:].reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # One collective carries the gradients, the loss and every rank's votes.
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [torch.tensor([loss.item(), *votes])])
        if self.distributed:
            dist.all_reduce(flat)
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad)).div_(self.world)
            offset += p.numel()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.step += 1
        tail = flat[-1 - len(votes):].tolist()
        return tail[0] / self.world, tail[1:]

    def evaluate(self) -> float:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        self.model.eval()
        totals = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            mine = torch.from_numpy(self.val[self.rank::self.world]).to(self.device)
            for start in range(0, len(mine), 64):
                ids = mine[start:start + 64]
                logits = self.model(ids[:, :-1]).float()
                loss = F.cross_entropy(logits.reshape(-1, self.vocab), ids[:, 1:].reshape(-1), reduction="sum")
                totals += torch.tensor([loss.item(), ids[:, 1:].numel()], dtype=torch.float64)
        if self.distributed:
            dist.all_reduce(totals)
        self.model.train()
        self.eval_loss = float(totals[0] / totals[1])
        return self.eval_loss

    def state(self, log: Mllog) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "val_loss": self.eval_loss, "clock_s": log.clock_s(), "run_start_ms": log.start_ms,
                "mllog": list(log.lines)}

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.eval_loss = state["step"], state["val_loss"]

    def save(self, log: Mllog) -> None:
        import torch
        import torch.distributed as dist

        if self.rank == 0 and self.s.ckpt_dir is not None:
            began = time.monotonic()
            payload = self.state(log)
            save_checkpoint(self.s.ckpt_dir, self.step, lambda d: torch.save(payload, d / "state.pt"),
                            {"val_loss": self.eval_loss, "samples": self.step * self.gbs, "clock_s": payload["clock_s"]})
            prune_checkpoints(self.s.ckpt_dir, self.s.keep_last, self.s.keep_best)
            # What a checkpoint costs, for the launcher's effective training time (the write, not the steps).
            print(f"mini_gpt checkpoint: step {self.step} written in {time.monotonic() - began:.3f} s",
                  file=sys.stderr, flush=True)
        if self.distributed:
            dist.barrier()


def start(s: Settings, run: Run, rank: int):
    """The run's MLLOG: resumed from the last checkpoint (its log printed again first) or begun."""
    import torch
    import torch.distributed as dist
    from mlperf_logging.mllog import constants as C

    found = checkpoints(s.ckpt_dir) if s.ckpt_dir else []
    resume = found[-1][1] if found else None
    if resume is not None:
        state = torch.load(resume / "state.pt", weights_only=False)
        log = Mllog(rank, state["run_start_ms"], state["clock_s"], state["mllog"])
        run.restore(state)
        if rank == 0:
            print("\n".join(log.lines), flush=True)  # the log up to the checkpoint, as it was
            print(f"mini_gpt: resuming from {resume} (step {run.step})", file=sys.stderr, flush=True)
        log.t0 = time.monotonic()  # the time to load and rebuild is not training time
        return log
    log = Mllog(rank, int(time.time() * 1000), 0.0, [])
    log("event", C.CACHE_CLEAR, False)
    log("start", C.INIT_START)
    log_hyperparameters(log, s, run.gbs, sum(len(t) for t in run.train))
    if run.distributed:
        dist.barrier()
    log("end", C.INIT_STOP)
    log("start", C.RUN_START)
    log("start", C.BLOCK_START, samples_count=0)
    return log


def train(s: Settings, run: Run, log: Mllog, stopper: Stopper) -> tuple[str, str]:
    """Steps until the target, MAX_STEPS, the time budget (run ends) or the job's limit (segment ends)."""
    from mlperf_logging.mllog import constants as C

    status, outcome, iter_t = C.ABORTED, None, time.monotonic()
    while outcome is None:
        mean_loss, (stop_votes, budget_votes) = run.train_step(
            [float(stopper.due()), float(log.clock_s() > s.max_minutes * 60.0)])
        if run.rank == 0 and run.step % 10 == 0:
            now = time.monotonic()
            print(f"mini_gpt progress: step {run.step}/{s.max_steps} tokens {run.step * run.gbs * s.seq} "
                  f"loss {mean_loss:.4f} iter_s {(now - iter_t) / 10:.4f}", file=sys.stderr, flush=True)
            iter_t = now
        last = run.step >= s.max_steps or budget_votes > 0
        if run.step % s.eval_every == 0 or last:
            samples = run.step * run.gbs
            log("end", C.BLOCK_STOP, samples_count=samples)
            log("start", C.EVAL_START, samples_count=samples)
            log("event", C.EVAL_ACCURACY, run.evaluate(), samples_count=samples)
            log("end", C.EVAL_STOP, samples_count=samples)
            if run.eval_loss <= s.target:
                status, outcome = C.SUCCESS, "done"
            elif last:
                outcome = "done"
            else:
                log("start", C.BLOCK_START, samples_count=samples)
        if outcome is None and stop_votes > 0:
            outcome = "resume"
            run.save(log)
        elif outcome is None and run.step % s.ckpt_every == 0:
            run.save(log)
    return status, outcome


def main() -> int:
    s = Settings()
    import torch.distributed as dist
    from mlperf_logging.mllog import constants as C

    rank, world, device, distributed = setup_distributed()
    stopper = Stopper(s)
    run = Run(s, rank, world, device, distributed)
    log = start(s, run, rank)
    first_step, seg_t0, clock_at_start = run.step, time.monotonic(), log.clock_s()
    status, outcome = train(s, run, log, stopper)
    if outcome == "done":
        log("end", C.RUN_STOP, status=status, samples_count=run.step * run.gbs)
    if rank == 0:
        record = {"status": outcome if outcome == "resume" else status, "from_step": first_step,
                  "to_step": run.step, "train_s": round(log.clock_s() - clock_at_start, 3),
                  "wall_s": round(time.monotonic() - seg_t0, 3), "val_loss": run.eval_loss,
                  "clock_s": round(log.clock_s(), 3)}
        print(f"mini_gpt segment: {json.dumps(record)}", file=sys.stderr, flush=True)
    if distributed:
        dist.barrier()  # as mini_lora: no rank closes its gloo pairs while a peer is still in a collective
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as exc:
        print(f"mini_gpt train.py: {exc}", file=sys.stderr)
        sys.exit(2)
