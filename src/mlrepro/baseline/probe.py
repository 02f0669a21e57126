"""Measure one probe run: compiled GPT, bf16/fp16 autocast, fused AdamW; time, TFLOP/s, MFU, peak memory.

Recipe (what the memory model is told, see `workload`): fp32 parameters, which are also the
optimizer's master weights, and fp32 gradients that accumulate over the micro-batches and stay
allocated between steps (zero_grad(set_to_none=False)); AdamW's two fp32 moments (fused kernel):
Megatron's fp32 master weights, fp32 gradient accumulation and Adam states, without its separate
bf16 weight copy (autocast casts the weights for each micro-batch instead: 16 B per parameter, not
18). Autocast to bf16/fp16 for the matmuls; the residual stream in bf16 (Megatron's default,
fp32_residual_connection off: the norms' saved inputs take the 2 B the memory model counts) or
fp32; causal attention through SDPA (flash, or cuDNN's kernel) or FlexAttention; the whole forward and loss compiled
as one graph (fullgraph; "block": each block on its own, one graph for all layers, compiled in
seconds); gradient accumulation to the global batch as in the baseline checklist (GBS 128 = MBS 4 x GA 16 x
DP 2). The vocabulary is GPT-2's padded to 50304 (a multiple of 128) as Megatron pads it, and the
FLOP count uses it as Megatron's does (flops.megatron).
"""

from __future__ import annotations

import time

from mlrepro import gpus
from mlrepro.baseline import flops
from mlrepro.plan import memory, models
from mlrepro.plan.layout import Layout
from mlrepro.plan.workloads import Training, Workload

GIB = 2**30


def workload(shape: models.ModelShape, mbs: int, ga: int = 1) -> tuple[Workload, Layout]:
    """The probe described to the planner's memory model (mlrepro.plan.memory)."""
    training = Training(param_bytes=4, grad_bytes=4, optimizer_bytes=8, distributed_optimizer=False,
                        dropout=False, flash_attention=True, logit_bytes=4)
    return Workload(name=shape.name, model=shape, training=training, gbs=mbs * ga), Layout(mbs=mbs, ga=ga)


def predicted_gib(shape: models.ModelShape, mbs: int, ga: int = 1) -> float:
    w, lay = workload(shape, mbs, ga)
    return memory.estimate(w, lay).total / GIB


def _step_fn(torch, model, opt, scaler, dtype, ga: int, device: str = "cuda"):
    def step(x, y):
        for _ in range(ga):
            with torch.autocast(device, dtype=dtype):
                loss = model(x, y) / ga
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.detach() * ga
    return step


def build(shape: models.ModelShape, precision: str = "bf16", ga: int = 1, residual: str = "bf16",
          compile_scope: str = "model", compile_mode: str = "default", device: str = "cuda", attention: str = "flash"):
    """(model, step): the probe's GPT on `device` and one optimizer step over `ga` micro-batches.

    compile_scope "block": each block compiled on its own (one graph serves all layers) and the
    loss; "model": the whole forward with the loss as one graph (fullgraph); "none": eager.
    """
    import torch

    from mlrepro.baseline.model import GPT  # torch at its top: the probe's workload and rows are read without torch

    if precision == "fp8":
        raise ValueError("fp8 needs Transformer Engine, which the portable probe does not use")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with torch.device(device):  # initialised on the GPU: 1.3B parameters take half a minute on the CPU
        model = GPT(shape, residual_dtype=dtype if residual != "fp32" else None,
                    attention=attention)
    if compile_scope == "block":
        for block in model.blocks:
            block.compile(mode=compile_mode)
        model.loss = torch.compile(model.loss, mode=compile_mode)
    elif compile_scope == "model":
        model.compile(mode=compile_mode, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
    return model, _step_fn(torch, model, opt, scaler, dtype, ga, device)


def timed_steps(step, x, y, warmup: int, steps: int) -> dict:
    """Warm up (the first steps compile), then time `steps` optimizer steps. On a GPU, also the
    memory held between steps (static_bytes) and the peak during the timed ones (peak_bytes)."""
    import torch

    cuda = x.is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step(x, y)
    sync()
    warmup_s = time.perf_counter() - t0
    static = torch.cuda.memory_allocated() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
    sync()
    return {"warmup_s": warmup_s, "step_s": (time.perf_counter() - t0) / steps, "static_bytes": static,
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None, "loss": float(loss)}


def measure(model_name: str, precision: str = "bf16", mbs: int = 16, steps: int = 10, warmup: int = 4,
            ga: int = 4, attention: str = "flash", compile_mode: str = "default", residual: str = "bf16",
            compile_scope: str = "model") -> dict:
    """One run on cuda:0: the baseline.json row for it."""
    import torch

    shape = models.model(model_name)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.reset_peak_memory_stats()
    model, step = build(shape, precision, ga, residual, compile_scope, compile_mode, attention=attention)
    x = torch.randint(0, shape.vocab, (mbs, shape.seq), device="cuda")
    t = timed_steps(step, x, torch.roll(x, -1, 1), warmup, steps)
    compile_s, dt, static, loss = t["warmup_s"], t["step_s"], t["static_bytes"], t["loss"]
    peak = t["peak_bytes"] / GIB
    gpu = torch.cuda.get_device_name(0)
    ref = gpus.gpu_model(gpu)
    peak_tflops = ref.peak_tflops_bf16 if ref else float("nan")
    gbs = mbs * ga
    tflops = flops.megatron(shape, gbs) / dt / 1e12
    predicted = predicted_gib(shape, mbs, ga)
    return {
        "workload": "probe", "model": shape.name, "precision": precision, "tp": 1, "pp": 1, "dp": 1,
        "mbs": mbs, "gbs": gbs, "seq": shape.seq, "iter_time_s": round(dt, 4),
        "samples_per_s": round(gbs / dt, 2), "tokens_per_s": round(gbs * shape.seq / dt), "attention": attention,
        "compile_mode": compile_mode, "compile_scope": compile_scope, "residual": residual,
        "tflops_per_gpu": round(tflops, 1), "mfu": round(tflops / peak_tflops, 4),
        "peak_mem_gib": round(peak, 2), "predicted_mem_gib": round(predicted, 2),
        "mem_error_pct": round(100 * (predicted - peak) / peak, 1),
        "static_mem_gib": round(static / GIB, 2), "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2),
        "params": sum(p.numel() for p in model.parameters()), "gpu": gpu, "peak_tflops": peak_tflops,
        "tflops_narayanan": round(flops.narayanan(shape, gbs) / dt / 1e12, 1), "warmup_s": round(compile_s, 1),
        "loss": round(float(loss), 3), "predicted_breakdown_gib": {k: round(v * 1e9 / GIB, 2) for k, v in
                                                                  memory.estimate(*workload(shape, mbs, ga)).as_gb().items()},
    }


def free(torch) -> None:
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()

