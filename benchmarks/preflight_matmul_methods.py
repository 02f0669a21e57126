"""Why a healthy H200 reads 655-664 TFLOP/s in the preflight against a 789 reference (issue 23, item 2).

One run on every visible GPU (one device call, about a minute), printing a table with ratios:
- `preflight`: the preflight's method before issue 23 (`old_preflight_tflops`: 8192^3 bf16, mean over a
  2 s window after 3 warm-up calls, host clock), and `steady`, mlrepro.preflight.matmul.measure (after it);
- a time series of the same matmul, each call timed by CUDA events, for TRACE_S seconds with NVML's SM
  clock, power, temperature and clock-event reasons sampled beside it (read only: no setting is
  changed). From it: `burst` = DESIGN.md section 8's method (mean of the first 10 calls after 3
  warm-ups), the mean of the first 2 s, and the median call of later windows (the steady state);
- 16384^3 for 1.5 s after the steady state (does a larger product change the rate?);
- all GPUs loaded at once (one process each), steady median;
- the degraded case: a matmul loop in another process on the last GPU while it is measured.

    python3 benchmarks/preflight_matmul_methods.py OUT.json
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

N = 8192
TRACE_S = 8.0


def old_preflight_tflops(index: int, n: int = N, seconds: float = 2.0) -> float:
    """The preflight's matmul before issue 23: the mean over `seconds` of calls after 3 warm-ups, host clock."""
    import torch

    with torch.cuda.device(index):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        calls, t0 = 0, time.perf_counter()
        while True:
            for _ in range(10):
                torch.matmul(a, b, out=c)
            calls += 10
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
        del a, b, c
        torch.cuda.empty_cache()
    return 2 * n ** 3 / (elapsed / calls) / 1e12


def nvml_sampler(index: int, stop: threading.Event, out: list, t0: float, period: float = 0.02) -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    while not stop.is_set():
        try:
            out.append({"t": time.perf_counter() - t0,
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                        "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                        "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)})
        except pynvml.NVMLError:
            pass
        time.sleep(period)
    pynvml.nvmlShutdown()


def static_info(index: int) -> dict:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def safe(fn, *a):
        try:
            return fn(h, *a)
        except pynvml.NVMLError:
            return None

    info = {"name": pynvml.nvmlDeviceGetName(h), "power_limit_w": (safe(pynvml.nvmlDeviceGetEnforcedPowerLimit) or 0) / 1000,
            "sm_max_mhz": safe(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
            "sm_app_mhz": safe(pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_SM),
            "temp_c": safe(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)}
    pynvml.nvmlShutdown()
    return info


def trace(index: int, seconds: float, n: int = N, sample: bool = True) -> dict:
    """Per-call times (ms, CUDA events) of back-to-back n^3 bf16 matmuls for `seconds`, after 3 warm-ups."""
    import torch

    torch.cuda.set_device(index)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    samples: list = []
    stop = threading.Event()
    t0 = time.perf_counter()
    th = threading.Thread(target=nvml_sampler, args=(index, stop, samples, t0)) if sample else None
    if th:
        th.start()
    events = [torch.cuda.Event(enable_timing=True)]
    events[0].record()
    host = []
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.matmul(a, b, out=c)
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            events.append(e)
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    if th:
        stop.set()
        th.join()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(len(events) - 1)]
    del a, b, c
    torch.cuda.empty_cache()
    return {"n": n, "ms": ms, "nvml": samples}


def tflops(ms: float, n: int = N) -> float:
    return 2 * n ** 3 / (ms / 1e3) / 1e12


def windows(ms: list[float], n: int = N) -> dict:
    """Rates of the call series: burst (first 10), mean of the first 2 s, medians of later windows."""
    t, cum = [], 0.0
    for x in ms:
        cum += x
        t.append(cum / 1e3)

    def sel(lo, hi):
        return [x for x, s in zip(ms, t) if lo <= s < hi]

    out = {"burst_mean10": tflops(statistics.mean(ms[:10]), n),
           "mean_0_2s": tflops(statistics.mean(sel(0, 2)), n),
           "median_0_2s": tflops(statistics.median(sel(0, 2)), n)}
    for lo, hi in ((0.5, 2.5), (1, 3), (2, 4), (4, 6), (6, 8)):
        w = sel(lo, hi)
        if w:
            out[f"median_{lo:g}_{hi:g}s"] = tflops(statistics.median(w), n)
            out[f"p10_{lo:g}_{hi:g}s"] = tflops(sorted(w)[int(0.9 * len(w))], n)
    out["bins_0.25s"] = [round(tflops(statistics.median(sel(i / 4, (i + 1) / 4)), n), 1)
                         for i in range(int(t[-1] * 4)) if sel(i / 4, (i + 1) / 4)]
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in out.items()}


def nvml_summary(samples: list[dict]) -> dict:
    if not samples:
        return {}
    late = [s for s in samples if s["t"] > 1.0] or samples
    return {"sm_mhz_first_0.1s": [s["sm_mhz"] for s in samples if s["t"] < 0.1][:5],
            "sm_mhz_median_after_1s": statistics.median(s["sm_mhz"] for s in late),
            "sm_mhz_min_after_1s": min(s["sm_mhz"] for s in late),
            "power_w_median_after_1s": round(statistics.median(s["power_w"] for s in late)),
            "power_w_max": round(max(s["power_w"] for s in samples)),
            "temp_c_max": max(s["temp_c"] for s in samples),
            "reasons_seen": sorted({hex(s["reasons"]) for s in samples}),
            "sm_mhz_bins_0.5s": [statistics.median(s["sm_mhz"] for s in samples if i / 2 <= s["t"] < (i + 1) / 2)
                                 for i in range(int(samples[-1]["t"] * 2)) if any(i / 2 <= s["t"] < (i + 1) / 2 for s in samples)]}


def steady_child(index: int, seconds: float, q) -> None:
    r = trace(index, seconds, sample=True)
    q.put((index, windows(r["ms"]), nvml_summary(r["nvml"])))


def load_child(index: int, stop_after: float) -> None:
    import torch

    torch.cuda.set_device(index)
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < stop_after:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def main(out_path: str) -> None:
    import torch

    from mlrepro.preflight import matmul

    ngpu = torch.cuda.device_count()
    doc = {"torch": torch.__version__, "gpus": {}, "concurrent": {}, "degraded": {}}
    t_start = time.perf_counter()
    for i in range(ngpu):
        g = {"info": static_info(i)}
        g["preflight_2s"] = round(old_preflight_tflops(i, seconds=2.0), 1)
        time.sleep(2.0)  # let it cool off a little: the trace starts from a near-idle GPU, as the reference did
        r = trace(i, TRACE_S)
        g["trace"] = windows(r["ms"])
        g["nvml"] = nvml_summary(r["nvml"])
        big = trace(i, 1.5, n=16384, sample=False)
        g["n16384_median"] = round(tflops(statistics.median(big["ms"][len(big["ms"]) // 3:]), 16384), 1)
        g["preflight_2s_after_load"] = round(old_preflight_tflops(i, seconds=2.0), 1)
        g["steady"] = matmul.measure(i, seconds=2.0, nvml_index=i)
        doc["gpus"][i] = g
        print(f"GPU{i} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    ctx = mp.get_context("spawn")
    if ngpu >= 2:
        q = ctx.Queue()
        ps = [ctx.Process(target=steady_child, args=(i, 4.0, q)) for i in range(ngpu)]
        for p in ps:
            p.start()
        for _ in ps:
            i, w, nv = q.get()
            doc["concurrent"][i] = {"trace": w, "nvml": nv}
        for p in ps:
            p.join()
        print(f"concurrent done at {time.perf_counter() - t_start:.0f} s", flush=True)
    last = ngpu - 1
    loader = ctx.Process(target=load_child, args=(last, 12.0))
    loader.start()
    time.sleep(3.0)
    doc["degraded"] = {"gpu": last, "preflight_2s": round(old_preflight_tflops(last, seconds=2.0), 1),
                       "steady": matmul.measure(last, seconds=2.0, nvml_index=last),
                       "trace": windows(trace(last, 4.0, sample=False)["ms"])}
    loader.terminate()
    loader.join()
    Path(out_path).write_text(json.dumps(doc, indent=1, default=str))

    ref = 789.0 if "H200" in str(doc["gpus"][0]["info"]["name"]) else 758.0
    print(f"\nreference (DESIGN.md section 8, burst method): {ref:g} TFLOP/s")
    print(f"{'GPU':<10}{'preflight 2s':>14}{'burst10':>10}{'mean 0-2s':>11}{'med 1-3s':>10}{'med 4-6s':>10}"
          f"{'med 6-8s':>10}{'16384^3':>9}{'all GPUs':>10}{'SM MHz':>8}{'W':>6}")
    for i, g in doc["gpus"].items():
        t = g["trace"]
        conc = doc["concurrent"].get(i, {}).get("trace", {}).get("median_2_4s", float("nan"))
        print(f"GPU{i:<7}{g['preflight_2s']:>14}{t['burst_mean10']:>10}{t['mean_0_2s']:>11}{t['median_1_3s']:>10}"
              f"{t.get('median_4_6s', float('nan')):>10}{t.get('median_6_8s', float('nan')):>10}{g['n16384_median']:>9}"
              f"{conc:>10}{g['nvml'].get('sm_mhz_median_after_1s', 0):>8}{g['nvml'].get('power_w_median_after_1s', 0):>6}")
        print(f"{'  / ref':<10}{g['preflight_2s'] / ref:>14.3f}{t['burst_mean10'] / ref:>10.3f}{t['mean_0_2s'] / ref:>11.3f}"
              f"{t['median_1_3s'] / ref:>10.3f}{t.get('median_4_6s', 0) / ref:>10.3f}{t.get('median_6_8s', 0) / ref:>10.3f}")
        print(f"  bins 0.25 s: {t['bins_0.25s']}")
        print(f"  nvml: {g['nvml']}  info: {g['info']}")
    d = doc["degraded"]
    print(f"degraded GPU{d['gpu']}: preflight 2s {d['preflight_2s']}, median 1-3s {d['trace'].get('median_1_3s')}, "
          f"steady {d['steady']}")
    for i, g in doc["gpus"].items():
        print(f"GPU{i} steady (mlrepro.preflight.matmul): {g['steady']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "matmul_methods.json")
