"""Per-GPU bf16 matmul TFLOP/s and device-memory copy TB/s, measured with plain PyTorch."""

from __future__ import annotations

import time


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


def matmul_tflops(index: int, n: int = 8192, seconds: float = 2.0) -> float:
    """bf16 n x n x n matmul on GPU `index` (2n^3 FLOPs per call)."""
    import torch

    with torch.cuda.device(index):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        t = _timed(torch, lambda: torch.matmul(a, b, out=c), seconds)
        torch.cuda.empty_cache()
    return 2 * n ** 3 / t / 1e12


def copy_tbps(index: int, nbytes: int = 1 << 30, seconds: float = 1.0) -> float:
    """Device-to-device copy of `nbytes` on GPU `index`; each copy reads and writes it (2 x nbytes moved)."""
    import torch

    with torch.cuda.device(index):
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        t = _timed(torch, lambda: dst.copy_(src), seconds)
        torch.cuda.empty_cache()
    return 2 * nbytes / t / 1e12


def measure(indices: list[int], seconds: float = 2.0) -> dict[int, dict]:
    """{index: {"matmul_bf16_tflops", "copy_tbps"}} for each GPU, one after the other."""
    return {i: {"matmul_bf16_tflops": round(matmul_tflops(i, seconds=seconds), 1),
                "copy_tbps": round(copy_tbps(i, seconds=seconds / 2), 3)} for i in indices}
