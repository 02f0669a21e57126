"""PyTorch profiler traces (Chrome trace JSON, as Megatron-LM's `--use-pytorch-profiler` writes them):
where a training step's time went on one rank.

A step is torch.profiler's `ProfilerStep#N` span on the host. Within the profiled steps, the GPU's
busy time is the union of its kernels, copies and memsets; what is left of the steps' wall time the
GPU waited (for the host to launch work, or for a peer in a collective). That split is what a cost
model of launch-bound layouts needs and what a step time alone cannot give: a micro-batch of 1 on a
small model is slow because the GPU idles, not because its kernels are slow.

Kernels are also summed by kind (GEMM, attention, NCCL collectives, the optimizer, everything else:
element-wise and reductions), by their names as cuBLAS, cuDNN/flash attention, NCCL and PyTorch's
multi-tensor apply give them.

A leaf: imports nothing from mlrepro. A trace that is not one (bad gzip, bad JSON, no profiled step,
odd field types) raises TraceError; reading never runs longer than the bytes it is given.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
from pathlib import Path

MAX_BYTES = 512 * 2**20  # a decompressed trace larger than this is refused, not read
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEP = re.compile(r"^ProfilerStep#(\d{1,18})$")
MAX_STEPS = 10_000
# Kinds of kernel, first match wins (the names are the libraries' own: cuBLAS/CUTLASS GEMMs, flash
# and cuDNN attention, NCCL, PyTorch's fused optimizer kernels).
KINDS = (
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax_warp", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|_sgemm|hgemm|matmul", re.I)),
    # Not "lamb": PyTorch's element-wise kernels are templates over lambdas ("{lambda()#1}").
    ("optimizer", re.compile(r"multi_tensor|adam", re.I)),
)


class TraceError(ValueError):
    """The bytes are not a profiler trace this module can read."""


def kind_of(kernel: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(kernel):
            return kind
    return "other"


def load(path: Path) -> dict:
    """The trace's JSON object (a .json or .json.gz file)."""
    path = Path(path)
    try:
        with path.open("rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
            data = stream.read(MAX_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: not readable as a trace ({exc})") from None
    if len(data) > MAX_BYTES:
        raise TraceError(f"{path}: larger than {MAX_BYTES >> 20} MiB decompressed; not read")
    try:
        trace = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{path}: not JSON ({str(exc)[:80]})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list")
    return trace


def _span(event) -> tuple[float, float] | None:
    """(start, end) in microseconds of a complete event, None for anything else."""
    if not isinstance(event, dict) or event.get("ph") != "X":
        return None
    ts, dur = event.get("ts"), event.get("dur")
    if isinstance(ts, bool) or isinstance(dur, bool) or not isinstance(ts, (int, float)) \
            or not isinstance(dur, (int, float)):
        return None
    try:
        start, end = float(ts), float(ts) + float(dur)
    except OverflowError:  # an integer beyond a float's range
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        return None
    return start, end


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of the spans as disjoint spans, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _covered(merged: list[tuple[float, float]], ends: list[float], lo: float, hi: float) -> float:
    """How much of [lo, hi] the disjoint, ordered spans cover."""
    total = 0.0
    for a, b in merged[bisect.bisect_right(ends, lo):]:
        if a >= hi:
            break
        total += min(b, hi) - max(a, lo)
    return total


def _steps(trace: dict, skip_first: int = 0) -> list[tuple[int, tuple[float, float]]]:
    """The profiled steps' host spans, in order: (step number, (start, end)). The GPU's copies of the same
    annotation (cat gpu_user_annotation) are not steps."""
    steps = []
    for event in trace.get("traceEvents") or []:
        span = _span(event)
        name = event.get("name") if span is not None else None
        if isinstance(name, str) and event.get("cat") in ("user_annotation", "cpu_op", None) \
                and (match := STEP.match(name)):
            steps.append((int(match.group(1)), span))
    steps.sort()
    steps = steps[skip_first:]
    if not steps:
        raise TraceError("no ProfilerStep# span: not a torch.profiler trace of training steps")
    if len(steps) > MAX_STEPS:
        raise TraceError(f"{len(steps)} profiled steps: more than the {MAX_STEPS} a profiling window holds")
    return steps


def summarize(trace: dict, skip_first: int = 0) -> dict:
    """Where the profiled steps' time went, per step on average: wall, GPU busy and waiting, kernel
    time by kind and the number of kernels. `skip_first` drops the first steps (a warm-up inside the
    profiled window)."""
    steps = _steps(trace, skip_first)
    gpu, named = [], []
    for event in trace.get("traceEvents") or []:
        span = _span(event)
        if span is not None and event.get("cat") in GPU_CATEGORIES and isinstance(event.get("name"), str):
            gpu.append(span)
            named.append((span, kind_of(event["name"]) if event["cat"] == "kernel" else "copy"))
    lo, hi = min(a for _, (a, _b) in steps), max(b for _, (_a, b) in steps)
    merged = _merged(gpu)
    ends = [b for _, b in merged]
    wall = sum(b - a for _, (a, b) in steps)
    busy = sum(_covered(merged, ends, a, b) for _, (a, b) in steps)
    by_kind: dict[str, float] = {}
    kernels = 0
    for (a, b), kind in named:
        if b > lo and a < hi:
            by_kind[kind] = by_kind.get(kind, 0.0) + min(b, hi) - max(a, lo)
            kernels += kind != "copy"
    if not all(math.isfinite(x) for x in (wall, busy, *by_kind.values())):
        raise TraceError("the profiled steps' times are out of range")
    n = len(steps)
    per = 1e-6 / n
    return {
        "steps": [s for s, _ in steps],
        "step_s": round(wall * per, 6),
        "gpu_busy_s": round(busy * per, 6),
        "gpu_idle_s": round((wall - busy) * per, 6),
        "gpu_busy_share": round(busy / wall, 4) if wall > 0 else None,
        "kernel_s": {k: round(v * per, 6) for k, v in sorted(by_kind.items())},
        "kernels_per_step": round(kernels / n, 1),
    }


def summarize_file(path: Path, skip_first: int = 0) -> dict:
    return summarize(load(path), skip_first=skip_first)


def top_kernels(trace: dict, n: int = 20) -> list[dict]:
    """The kernels that took the most GPU time in the profiled steps, per step: name (shortened), kind,
    seconds and launches."""
    steps = _steps(trace)
    lo, hi = min(a for _, (a, _b) in steps), max(b for _, (_a, b) in steps)
    by_name: dict[str, list[float]] = {}
    for e in trace["traceEvents"]:
        span = _span(e)
        if span is None or e.get("cat") != "kernel" or not isinstance(e.get("name"), str):
            continue
        a, b = span
        if b > lo and a < hi:
            entry = by_name.setdefault(e["name"][:160], [0.0, 0])
            entry[0] += min(b, hi) - max(a, lo)
            entry[1] += 1
    per = 1.0 / len(steps)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"kernel": name, "kind": kind_of(name), "s": round(t * 1e-6 * per, 6), "launches": round(c * per, 1)}
            for name, (t, c) in ranked]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mlrepro.formats.torch_trace",
                                     description="Where a profiled training step's time went, from a PyTorch "
                                                 "profiler trace (Megatron-LM's --use-pytorch-profiler)")
    parser.add_argument("trace", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15, help="the kernels with the most GPU time (0: none)")
    args = parser.parse_args(argv)
    status = 0
    for path in args.trace:
        try:
            trace = load(path)
            summary, top = summarize(trace), top_kernels(trace, args.top) if args.top else []
        except TraceError as exc:
            print(f"{path}: {exc}")
            status = 1
            continue
        print(f"{path}: {json.dumps(summary)}")
        for k in top:
            print(f"  {k['s'] * 1e3:9.3f} ms {k['launches']:8.1f} x  {k['kind']:9s} {k['kernel']}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
