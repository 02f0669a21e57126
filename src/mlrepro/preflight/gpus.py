"""The node's GPUs through NVML (nvidia-ml-py): count, name, memory, clocks, ECC errors, health, who else uses them."""

from __future__ import annotations

import contextlib
import csv
import io
from typing import Any, Iterator

from mlrepro.preflight import visible

# The same fields through nvidia-smi, for nodes where NVML cannot be loaded from Python and for
# recording fixtures: `nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits`.
QUERY = ("index,name,memory.total,clocks.sm,clocks.max.sm,ecc.errors.uncorrected.volatile.total,"
         "temperature.gpu,utilization.gpu,power.draw,clocks_throttle_reasons.active")


def _num(text: str):
    text = text.strip()
    if text in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    try:
        return int(text, 0) if text.startswith("0x") else float(text)
    except ValueError:
        return text


def parse_query_csv(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`."""
    keys = QUERY.split(",")
    rows = []
    for rec in csv.reader(io.StringIO(text)):
        if len(rec) != len(keys):
            continue
        r = dict(zip(keys, rec))
        rows.append({
            "index": int(r["index"]), "name": r["name"].strip(),
            "memory_gib": round(_num(r["memory.total"]) / 1024, 2),
            "sm_clock_mhz": _num(r["clocks.sm"]), "sm_clock_max_mhz": _num(r["clocks.max.sm"]),
            "ecc_uncorrected": _num(r["ecc.errors.uncorrected.volatile.total"]),
            "temperature_c": _num(r["temperature.gpu"]), "utilization_pct": _num(r["utilization.gpu"]),
            "power_w": _num(r["power.draw"]), "throttle_reasons": _num(r["clocks_throttle_reasons.active"]),
            "other_processes": [],
        })
    return rows


def _nvml_one(pynvml, i: int, nvml_index: int) -> dict:
    """GPU `nvml_index` of the node, which torch numbers `i` in this process."""
    h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)

    def safe(fn, *a):
        try:
            return fn(h, *a)
        except pynvml.NVMLError:
            return None

    name = pynvml.nvmlDeviceGetName(h)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    util = safe(pynvml.nvmlDeviceGetUtilizationRates)
    procs = safe(pynvml.nvmlDeviceGetComputeRunningProcesses) or []
    power = safe(pynvml.nvmlDeviceGetPowerUsage)
    return {
        "index": i, "nvml_index": nvml_index, "name": name.decode() if isinstance(name, bytes) else name,
        "memory_gib": round(mem.total / 2**30, 2),
        "sm_clock_mhz": safe(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": safe(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
        "ecc_uncorrected": safe(pynvml.nvmlDeviceGetTotalEccErrors, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                pynvml.NVML_VOLATILE_ECC),
        "temperature_c": safe(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        "utilization_pct": util.gpu if util else None,
        "power_w": power / 1000 if power is not None else None,
        "throttle_reasons": safe(pynvml.nvmlDeviceGetCurrentClocksEventReasons),
        "other_processes": [{"pid": p.pid, "used_gib": round((p.usedGpuMemory or 0) / 2**30, 2)} for p in procs],
    }


@contextlib.contextmanager
def _visible_gpus(cuda_visible_devices: str | None) -> Iterator[tuple[Any, list[int] | str]]:
    """NVML, initialised for the block, with the NVML indices of the GPUs `cuda_visible_devices` names
    (all of the node when unset) in the order torch numbers them; (None, reason) without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound and friends: no driver here
        yield None, f"no NVIDIA driver: {exc}"
        return
    try:
        def uuid(i: int) -> str:
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            return u.decode() if isinstance(u, bytes) else u

        yield pynvml, visible.nvml_indices(cuda_visible_devices, pynvml.nvmlDeviceGetCount(), uuid)
    finally:
        pynvml.nvmlShutdown()


def collect() -> tuple[str | None, list[dict]]:
    """(None, GPUs) through NVML; (reason, []) where there is no NVIDIA driver (a CPU machine). The GPUs
    are those CUDA_VISIBLE_DEVICES gives this process (all of the node when unset), indexed as torch
    numbers them, each with its NVML index."""
    import os

    with _visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")) as (pynvml, chosen):
        if pynvml is None:
            return chosen, []
        return None, [_nvml_one(pynvml, i, n) for i, n in enumerate(chosen)]


def energy_j(cuda_visible_devices: str | None, count: int) -> float | None:
    """The energy NVML's counters say the first `count` GPUs of `cuda_visible_devices` (all the node's
    when unset) used since the driver loaded, in joules; None without a driver, or where a GPU keeps no
    counter (before Volta). A seed's energy is the difference of two readings around its attempt."""
    try:
        from pynvml import NVMLError
    except ImportError:
        return None
    try:
        with _visible_gpus(cuda_visible_devices) as (pynvml, chosen):
            if pynvml is None:
                return None
            millijoules = [pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(n))
                           for n in chosen[:count]]
    except NVMLError:  # a GPU without the counter, or one NVML cannot reach: no reading
        return None
    return sum(millijoules) / 1000 if millijoules else None


def energy_between(before: float | None, after: float | None) -> float | None:
    """Joules used between two readings of energy_j (None when either is missing, or the counters went
    back: the driver was reloaded meanwhile)."""
    if before is None or after is None or after < before:
        return None
    return after - before


def health(gpu: dict, own_pids: set[int]) -> list[tuple[str, str]]:
    """(verdict, why) findings about one GPU that do not need a measurement."""
    found = []
    if gpu.get("ecc_uncorrected"):
        found.append(("fail", f"{gpu['ecc_uncorrected']:g} uncorrected ECC errors since the driver loaded"))
    others = [p for p in gpu.get("other_processes", []) if p["pid"] not in own_pids]
    if others:
        found.append(("warn", "other processes use this GPU: " + ", ".join(f"pid {p['pid']} ({p['used_gib']} GiB)" for p in others)))
    t = gpu.get("temperature_c")
    if isinstance(t, (int, float)) and t >= 85:
        found.append(("warn", f"temperature {t:g} C"))
    return found
