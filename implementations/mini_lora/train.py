#!/usr/bin/env python3
"""mini_lora trainer: LoRA fine-tuning of a small frozen Llama for summarization.

The miniature of NVIDIA's llama2_70b_lora: the base checkpoint in $MODEL stays
frozen, LoRA adapters (rank 16) on the attention projections are trained
data-parallel over torch.distributed ranks, the loss is taken on summary tokens
only, and the run stops as soon as the validation loss reaches the target.
MLLOG lines (mlperf_logging.mllog) go to stdout from rank 0 only, with the keys
the llama2_70b_lora compliance rules ask for.

Launched by run_and_time.sh: the torch.distributed environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) comes from torchrun or srun.
Other settings come from the environment; see ENVIRONMENT below.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings

ENVIRONMENT = """\
required: DATADIR (train.npy, validation.npy), MODEL (base checkpoint), SEED
optional: MAX_STEPS (2000), LR (0.001), MINIBS (8, per rank), TP/PP/CP (must be 1),
          TARGET_EVAL_LOSS (0.925), EVAL_EVERY (steps, 10), MAX_MINUTES (time budget;
          default WALLTIME_RUNANDTIME or 10), WARMUP_STEPS (0), WEIGHT_DECAY (0.0001),
          GRAD_CLIP (0.3), LORA_ALPHA (32), EVAL_BATCH (64), TORCH_NUM_THREADS,
          SUBMISSION_BENCHMARK (mini_lora), SUBMISSION_ORG, SUBMISSION_DIVISION (closed),
          SUBMISSION_STATUS (onprem), SUBMISSION_PLATFORM (DGXSYSTEM)"""

LORA_RANK = 16
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class UsageError(Exception):
    """A setting the user controls is missing or wrong; reported without a traceback."""


def _env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, "")
    if value == "":
        if default is None:
            raise UsageError(f"required environment variable {name} is not set\n{ENVIRONMENT}")
        return default
    return value


def _env_num(name: str, default, kind):
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
        self.data_dir = _env_str("DATADIR")
        self.model_dir = _env_str("MODEL")
        self.seed = _env_num("SEED", None, int)
        self.max_steps = _env_num("MAX_STEPS", 2000, int)
        self.lr = _env_num("LR", 0.001, float)
        self.minibs = _env_num("MINIBS", 8, int)
        self.target = _env_num("TARGET_EVAL_LOSS", 0.925, float)
        self.eval_every = _env_num("EVAL_EVERY", 10, int)
        default_minutes = _env_num("WALLTIME_RUNANDTIME", 10.0, float)
        self.max_minutes = _env_num("MAX_MINUTES", default_minutes, float)
        self.warmup_steps = _env_num("WARMUP_STEPS", 0, int)
        self.weight_decay = _env_num("WEIGHT_DECAY", 0.0001, float)
        self.grad_clip = _env_num("GRAD_CLIP", 0.3, float)
        self.lora_alpha = _env_num("LORA_ALPHA", 32, int)
        self.eval_batch = _env_num("EVAL_BATCH", 64, int)
        self.benchmark = _env_str("SUBMISSION_BENCHMARK", "mini_lora")
        self.org = _env_str("SUBMISSION_ORG", "mlrepro")
        self.division = _env_str("SUBMISSION_DIVISION", "closed")
        self.status = _env_str("SUBMISSION_STATUS", "onprem")
        self.platform = _env_str("SUBMISSION_PLATFORM", _env_str("DGXSYSTEM", "CPU"))
        for name in ("TP", "PP", "CP"):
            value = _env_num(name, 1, int)
            if value != 1:
                raise UsageError(
                    f"{name}={value}: mini_lora is data-parallel only; tensor, pipeline and context "
                    "parallelism are not implemented (use a config with tp1pp1cp1)"
                )
        for name, value in (("MAX_STEPS", self.max_steps), ("MINIBS", self.minibs), ("EVAL_EVERY", self.eval_every),
                            ("EVAL_BATCH", self.eval_batch)):
            if value < 1:
                raise UsageError(f"{name}={value} must be at least 1")
        if self.lr <= 0 or self.max_minutes <= 0:
            raise UsageError("LR and MAX_MINUTES must be positive")
        if self.seed < 0:
            raise UsageError(f"SEED={self.seed} must be >= 0")


def load_split(data_dir: str, name: str):
    """(input_ids int64, loss_mask float32) of DATADIR/<name>.npy, each (samples, length).

    Loaded with allow_pickle=False: the file is plain arrays, and one that holds pickled
    objects is refused before any of it is unpickled (a pickle can run code).
    """
    import numpy as np

    path = os.path.join(data_dir, f"{name}.npy")
    if not os.path.isfile(path):
        raise UsageError(f"DATADIR={data_dir} has no {name}.npy (run scripts/download_dataset.py)")
    try:
        records = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise UsageError(f"{path} is not a plain array file ({exc}); refusing to unpickle it") from None
    fields = records.dtype.names or ()
    if "input_ids" not in fields or "loss_mask" not in fields or records.ndim != 1 or records["input_ids"].ndim != 2:
        raise UsageError(f"{path}: expected records with input_ids and loss_mask, found dtype {records.dtype}")
    return records["input_ids"].astype(np.int64), records["loss_mask"].astype(np.float32)


def main() -> int:
    try:
        settings = Settings()
    except UsageError as exc:
        print(f"mini_lora train.py: {exc}", file=sys.stderr)
        return 2

    # Heavy imports only after the settings are known to be usable.
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from mlperf_logging import mllog
    from mlperf_logging.mllog import constants as C

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("DGXNGPU") or 1)

    mllogger = mllog.get_mllogger()
    mllog.config(default_stack_offset=2, root_dir=os.path.dirname(os.path.abspath(__file__)))

    def log(kind: str, key: str, value=None, **metadata) -> None:
        # Only rank 0 writes MLLOG: the score is read from one stream per run.
        if rank == 0:
            getattr(mllogger, kind)(key=key, value=value, metadata=metadata or None)
            sys.stdout.flush()

    # The miniature does not drop the page cache (it would need root and slows
    # everyone else on a shared machine); it says so honestly.
    log("event", C.CACHE_CLEAR, False)
    log("start", C.INIT_START)

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        threads = int(os.environ.get("TORCH_NUM_THREADS") or 0) or max(1, len(os.sched_getaffinity(0)) // ranks_per_node)
        # Several ranks share the node's cores; more threads than that oversubscribe.
        torch.set_num_threads(threads)
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    distributed = dist.is_initialized()

    train_ids, train_mask = map(torch.from_numpy, load_split(settings.data_dir, "train"))
    val_ids, val_mask = map(torch.from_numpy, load_split(settings.data_dir, "validation"))

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    # Progress bars and deprecation chatter from the libraries would bury the MLLOG stream.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not os.path.isfile(os.path.join(settings.model_dir, "config.json")):
        raise UsageError(f"MODEL={settings.model_dir} has no config.json (run scripts/download_model.py)")
    base = LlamaForCausalLM.from_pretrained(settings.model_dir, dtype=torch.float32)
    # Same seed on every rank, so every rank starts from the same adapters; the
    # broadcast below makes that a guarantee rather than an assumption.
    torch.manual_seed(settings.seed)
    lora = LoraConfig(r=LORA_RANK, lora_alpha=settings.lora_alpha, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none")
    model = get_peft_model(base, lora).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if distributed:
        for p in params:
            dist.broadcast(p.data, src=0)

    gbs = settings.minibs * world
    steps_per_epoch = len(train_ids) // gbs
    if steps_per_epoch < 1:
        raise UsageError(f"global batch {gbs} is larger than the {len(train_ids)} training samples")

    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.999))

    def lr_factor(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        span = max(1, settings.max_steps - settings.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * (step - settings.warmup_steps) / span))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

    log("event", C.SUBMISSION_BENCHMARK, settings.benchmark)
    log("event", C.SUBMISSION_ORG, settings.org)
    log("event", C.SUBMISSION_DIVISION, settings.division)
    log("event", C.SUBMISSION_STATUS, settings.status)
    log("event", C.SUBMISSION_PLATFORM, settings.platform)
    log("event", C.SEED, settings.seed)
    log("event", C.GLOBAL_BATCH_SIZE, gbs)
    log("event", C.TRAIN_SAMPLES, len(train_ids))
    log("event", C.EVAL_SAMPLES, len(val_ids))
    log("event", C.OPT_BASE_LR, settings.lr)
    log("event", C.OPT_ADAMW_WEIGHT_DECAY, settings.weight_decay)
    log("event", C.OPT_GRADIENT_CLIP_NORM, settings.grad_clip)
    log("event", C.OPT_LR_WARMUP_FACTOR, settings.warmup_steps / settings.max_steps)
    log("event", C.OPT_LR_TRAINING_STEPS, settings.max_steps)
    log("event", "lora_rank", LORA_RANK)  # no constant for it in mlperf_logging 4.1
    log("event", C.LORA_ALPHA, settings.lora_alpha)
    log("event", C.GRADIENT_ACCUMULATION_STEPS, 1)
    log("event", C.MAX_STEPS, settings.max_steps)

    def summary_loss(ids, mask):
        """Summed token cross-entropy over the scored tokens, and how many there were."""
        logits = model(input_ids=ids).logits[:, :-1].float()
        target = ids[:, 1:]
        weight = mask[:, 1:]
        per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
        return (per_token * weight.reshape(-1)).sum(), weight.sum()

    def evaluate() -> float:
        model.eval()
        totals = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            # Ranks take interleaved shares of the validation set; the sums are exact.
            mine = torch.arange(rank, len(val_ids), world)
            for start in range(0, len(mine), settings.eval_batch):
                idx = mine[start : start + settings.eval_batch]
                loss_sum, count = summary_loss(val_ids[idx].to(device), val_mask[idx].to(device))
                totals += torch.stack([loss_sum.double().cpu(), count.double().cpu()])
        if distributed:
            totals = totals.to(device)
            dist.all_reduce(totals)
            totals = totals.cpu()
        model.train()
        return float(totals[0] / totals[1])

    def batch_for(step: int):
        epoch, offset = divmod(step, steps_per_epoch)
        # The global order depends only on SEED and the epoch, so the global batch
        # is the same whatever the number of ranks; each rank takes its slice.
        order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(settings.seed * 1000 + epoch))
        idx = order[offset * gbs + rank * settings.minibs : offset * gbs + (rank + 1) * settings.minibs]
        return train_ids[idx].to(device), train_mask[idx].to(device)

    if distributed:
        dist.barrier()
    log("end", C.INIT_STOP)
    log("start", C.RUN_START)
    run_start = time.monotonic()
    budget_s = settings.max_minutes * 60.0

    model.train()
    status = C.ABORTED
    step = 0
    samples = 0
    eval_loss = float("nan")
    stop = False
    log("start", C.BLOCK_START, samples_count=samples)
    while not stop:
        ids, mask = batch_for(step)
        loss_sum, count = summary_loss(ids, mask)
        optimizer.zero_grad(set_to_none=True)
        loss_sum.backward()
        over_budget = time.monotonic() - run_start > budget_s
        # One collective per step carries the gradients, the token count that
        # normalizes them, and every rank's "out of time" vote, so all ranks
        # stop at the same step.
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [
            torch.stack([count.detach(), loss_sum.detach(), torch.tensor(float(over_budget), device=device)])
        ])
        if distributed:
            dist.all_reduce(flat)
        tokens, _, votes = flat[-3:].tolist()
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad)).div_(max(tokens, 1.0))
            offset += n
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        samples += gbs

        last_step = step >= settings.max_steps or votes > 0
        if step % settings.eval_every == 0 or last_step:
            log("end", C.BLOCK_STOP, samples_count=samples)
            log("start", C.EVAL_START, samples_count=samples)
            eval_loss = evaluate()
            log("event", C.EVAL_ACCURACY, eval_loss, samples_count=samples)
            log("end", C.EVAL_STOP, samples_count=samples)
            if eval_loss <= settings.target:
                status = C.SUCCESS
                stop = True
            elif last_step:
                stop = True
            else:
                log("start", C.BLOCK_START, samples_count=samples)

    log("end", C.RUN_STOP, status=status, samples_count=samples)
    if rank == 0:
        elapsed = time.monotonic() - run_start
        print(
            f"mini_lora: {status} after {step} steps ({samples} samples), eval loss {eval_loss:.4f} "
            f"(target {settings.target}), {elapsed:.1f} s",
            file=sys.stderr,
        )
    if distributed:
        # Every rank past its last collective before any tears its gloo pairs down: a rank that closes
        # them while a peer still finishes the eval all_reduce aborts that peer at exit (CI, once:
        # "terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as exc:
        print(f"mini_lora train.py: {exc}", file=sys.stderr)
        sys.exit(2)
