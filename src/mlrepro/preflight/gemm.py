"""The GEMM sweep: the bf16 rate of the GEMM shapes a training layout produces, on one GPU.

One 8192^3 product says what a GPU reaches at its best; a layout's GEMMs are smaller (a micro-batch
of 1 of GPT-1.3B multiplies 2048 x 2048 by 2048 x 6144; tensor parallelism halves n or k), and a
small GEMM runs at a lower rate. The planner (mlrepro.plan.cost) prices each GEMM of a layout at the
rate measured here for its shape, interpolated between the shapes measured.

The shapes: the forward GEMMs of a GPT layer (qkv, proj, fc1, fc2) and its output layer (logits) at
sequence 2048, for micro-batches 1-16 and TP 1 and 2, of the GPT sizes in `MODELS`, and a few
squares. Each shape is timed after a warm-up by CUDA events, the median call (mlrepro.preflight.matmul's
method), in a budget of about `SECONDS` for the whole sweep. Without CUDA the record says why, and
the planner uses its default curve.

The record (preflight.json's "gemm"; docs/measurements/planner/h200x2_sweep/gemm_sweep.json):
    {"gpu": "NVIDIA H200", "dtype": "bf16", "seconds": 9.8,
     "rows": [{"name": "qkv", "model": "gpt-1.3b", "mbs": 1, "tp": 1, "m": 2048, "n": 6144, "k": 2048,
               "seconds": 0.000102, "tflops": 505.3}, ...]}
"""

from __future__ import annotations

import statistics
import time

SECONDS = 10.0
SEQ = 2048
MBS = (1, 2, 4, 8, 16)
TP = (1, 2)
# (hidden, FFN hidden, padded vocabulary) of the GPT sizes the miniature and the baseline train;
# the same shapes as mlrepro.plan.models (tests/unit/plan/test_calibration.py checks it).
MODELS = {"gpt-126m": (768, 3072, 50304), "gpt-1.3b": (2048, 8192, 50304)}
SQUARES = (1024, 2048, 4096, 8192)


def shapes(models: dict | None = None, mbs=MBS, tp=TP, seq: int = SEQ) -> list[dict]:
    """The forward GEMMs (m x k times k x n) of each model's layer and output layer per micro-batch and TP."""
    out = []
    for model, (h, ffn, vocab) in (models or MODELS).items():
        for b in mbs:
            for t in tp:
                m = b * seq
                for name, n, k in (("qkv", 3 * h // t, h), ("proj", h, h // t), ("fc1", ffn // t, h),
                                   ("fc2", h, ffn // t), ("logits", vocab // t, h)):
                    out.append({"name": name, "model": model, "mbs": b, "tp": t, "m": m, "n": n, "k": k})
    out += [{"name": "square", "model": None, "mbs": None, "tp": None, "m": n, "n": n, "k": n} for n in SQUARES]
    # One shape measured once, however many layouts share it.
    seen, unique = set(), []
    for s in out:
        key = (s["m"], s["n"], s["k"])
        if key not in seen:
            seen.add(key)
            unique.append(s)
    return unique


def flops(s: dict) -> float:
    return 2.0 * s["m"] * s["n"] * s["k"]


def why_not() -> str | None:
    """Why no sweep can run here (None: it can)."""
    try:
        import torch
    except ImportError:
        return "skipped: PyTorch is not installed"
    if not torch.cuda.is_available():
        return "skipped: no CUDA GPU visible (the planner uses its default GEMM curve)"
    return None


def sweep(device: int = 0, seconds: float = SECONDS, models: dict | None = None) -> dict:
    """The sweep on one GPU: the record above, or {"skipped": why}."""
    why = why_not()
    if why:
        return {"skipped": why, "rows": []}
    import torch

    todo = shapes(models)
    started = time.monotonic()
    dev = torch.device("cuda", device)
    per_shape = seconds / len(todo)
    rows = []
    with torch.cuda.device(dev):
        for s in todo:
            a = torch.randn(s["m"], s["k"], device=dev, dtype=torch.bfloat16)
            b = torch.randn(s["k"], s["n"], device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                torch.mm(a, b)
            torch.cuda.synchronize()
            # Calls in the budget, from one timed call: at least 5, at most 200.
            t0 = time.perf_counter()
            torch.mm(a, b)
            torch.cuda.synchronize()
            one = max(time.perf_counter() - t0, 1e-6)
            calls = max(5, min(200, int(per_shape / one)))
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(calls)]
            for start, end in events:
                start.record()
                torch.mm(a, b)
                end.record()
            torch.cuda.synchronize()
            median = statistics.median(start.elapsed_time(end) for start, end in events) / 1e3
            rows.append({**s, "seconds": round(median, 9), "tflops": round(flops(s) / median / 1e12, 1)})
            del a, b
    return {"gpu": torch.cuda.get_device_name(dev), "dtype": "bf16", "seconds": round(time.monotonic() - started, 1),
            "rows": rows}
