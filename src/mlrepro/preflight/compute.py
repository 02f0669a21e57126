"""Per-GPU bf16 matmul TFLOP/s (the power-capped steady state, mlrepro.preflight.matmul) and
device-memory copy TB/s, measured with plain PyTorch."""

from __future__ import annotations

import time

from mlrepro.preflight import matmul


def _timed(torch, fn, seconds: float) -> float:
    """Seconds per call of fn, over at least `seconds` of calls after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return elapsed / n


def copy_tbps(index: int, nbytes: int = 1 << 30, seconds: float = 1.0) -> float:
    """Device-to-device copy of `nbytes` on GPU `index`; each copy reads and writes it (2 x nbytes moved)."""
    import torch

    with torch.cuda.device(index):
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        t = _timed(torch, lambda: dst.copy_(src), seconds)
        torch.cuda.empty_cache()
    return 2 * nbytes / t / 1e12


def measure(indices: list[int], seconds: float = 2.0, nvml: dict[int, int] | None = None) -> dict[int, dict]:
    """{torch index: {"matmul_bf16_tflops", ..., "copy_tbps"}} for each GPU, one after the other;
    `nvml` maps a torch index to its NVML index (the clock and power read under load)."""
    nvml = nvml or {}
    # The warm-up takes the boost-clock burst out of the window (0.25 s on an H200); a quick check's
    # 0.3 s window gets as long a warm-up.
    return {i: matmul.measure(i, seconds=seconds, warmup_s=min(0.5, seconds), nvml_index=nvml.get(i))
            | {"copy_tbps": round(copy_tbps(i, seconds=seconds / 2), 3)} for i in indices}
