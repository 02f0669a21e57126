"""The bf16 matmul rate of one GPU in the state a training step meets it: the power-capped steady state.

Measured on 2x H200 (docs/measurements/multigpu/matmul_methods.json, benchmarks/preflight_matmul_methods.py):
after an idle spell the first ten 8192^3 products run at the 1980 MHz boost clock (787 and 766 TFLOP/s;
DESIGN.md's 789 was measured this way, the mean of ten products after three warm-ups). Within 0.25 s
the 700 W power cap takes over (NVML clock-event reason "SW power cap"), the SM clock falls to
1440-1485 MHz, and the rate settles at 652-676 TFLOP/s, where it stays for as long as the load lasts.
Training is that steady state. A window that includes the burst reads a mix that depends on its
length, and a reference taken in the burst sits 16% above every healthy steady reading (issue 23:
12 of 12 healthy GPU verdicts were `warn`). So the measurement warms up past the burst, times every
call with CUDA events, and takes the median call: one call slowed by something else on the node does
not move it, while a GPU shared with another job is slower on every call and reads low.
"""

from __future__ import annotations

import statistics
import time

BURST_CALLS = 10  # DESIGN.md section 8's method: the mean of ten products after three warm-ups


def flops(n: int) -> float:
    """Floating-point operations of one n x n x n matrix product."""
    return 2.0 * n ** 3


def rate_tflops(call_ms: list[float], n: int) -> float:
    """TFLOP/s of the median call (milliseconds each) of n^3 products."""
    if not call_ms:
        raise ValueError("no timed calls")
    return flops(n) / (statistics.median(call_ms) / 1e3) / 1e12


def burst_tflops(call_ms: list[float], n: int) -> float | None:
    """TFLOP/s of the first BURST_CALLS calls (mean), or None with fewer calls."""
    if len(call_ms) < BURST_CALLS:
        return None
    return flops(n) / (statistics.mean(call_ms[:BURST_CALLS]) / 1e3) / 1e12


def under_load(nvml_index: int | None) -> dict:
    """SM clock, power and clock-event reasons read through NVML (read only) while the GPU is busy."""
    if nvml_index is None:
        return {}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML here: the figures are only an explanation beside the rate
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        out = {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
               "power_w": round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000),
               "clock_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)}
        try:
            out["power_limit_w"] = round(pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
        except pynvml.NVMLError:
            pass
        return out
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def measure(index: int, seconds: float = 2.0, n: int = 8192, warmup_s: float = 0.5,
            nvml_index: int | None = None) -> dict:
    """bf16 n^3 products on torch device `index`: the median call over `seconds` after `warmup_s` of
    calls (past the boost-clock burst), the burst rate of the first calls, and the clock and power under load."""
    import torch

    with torch.cuda.device(index):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        stamps = [torch.cuda.Event(enable_timing=True)]
        stamps[0].record()
        t0 = time.perf_counter()
        timed_from = None
        while True:
            for _ in range(10):
                torch.matmul(a, b, out=c)
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                stamps.append(e)
            now = time.perf_counter() - t0
            if timed_from is None and now >= warmup_s:
                timed_from = len(stamps) - 1
            if now >= warmup_s + seconds:
                break
        state = under_load(nvml_index)  # the queue still holds work: the GPU is busy while NVML is read
        torch.cuda.synchronize()
        call_ms = [stamps[i].elapsed_time(stamps[i + 1]) for i in range(len(stamps) - 1)]
        del a, b, c
        torch.cuda.empty_cache()
    # The host runs ahead of the GPU by at most the launch queue, so calls recorded after the host
    # passed warmup_s ran later still: all of them are past the burst.
    timed = call_ms[timed_from:] or call_ms
    out = {"matmul_bf16_tflops": round(rate_tflops(timed, n), 1), "matmul_calls": len(timed)}
    burst = burst_tflops(call_ms, n)
    if burst is not None:
        out["matmul_bf16_burst_tflops"] = round(burst, 1)
    return out | {f"under_load_{k}": v for k, v in state.items()}
