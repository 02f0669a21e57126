"""Where the baseline probe's step time goes, and which compile settings buy MFU (issue 12).

Each variant runs in a child process of its own (inductor settings and GPU memory do not leak
between variants): build the probe (mlrepro.baseline.probe.build), warm up, time `--steps`
optimizer steps, then, with `profile`, record one step with torch.profiler and sum the GPU kernel
time by kind (GEMM, attention, Triton-fused elementwise/reductions, optimizer, other), each with
its share of the step and, for GEMM and attention, the TFLOP/s they ran at (Megatron's count of
their FLOPs over their kernel time). Prints a table last; rows as JSON lines on the way.

    python benchmarks/baseline/probe_variants.py --variants best,cdt,maxat --out $OUT/variants.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    # the fastest of the second round (docs/measurements/baseline_probe/README.md): 52.3% on H100 and H200
    "best": {"scope": "model", "mode": "default", "mbs": 16, "ga": 4, "profile": True},
    "cdt": {"scope": "model", "mode": "default", "mbs": 16, "ga": 4, "inductor": {"coordinate_descent_tuning": True}},
    "maxat": {"scope": "block", "mode": "max-autotune-no-cudagraphs", "mbs": 16, "ga": 4, "profile": True},
    "cudnn": {"scope": "model", "mode": "default", "mbs": 16, "ga": 4, "attention": "cudnn", "profile": True},
    "flex": {"scope": "model", "mode": "default", "mbs": 16, "ga": 4, "attention": "flex", "profile": True},
    "ga8": {"scope": "model", "mode": "default", "mbs": 16, "ga": 8},
    "cudnn_ga8": {"scope": "model", "mode": "default", "mbs": 16, "ga": 8, "attention": "cudnn"},
    "cudnn_blk": {"scope": "block", "mode": "default", "mbs": 16, "ga": 4, "attention": "cudnn"},
}

KINDS = (("attention", ("flash", "fmha", "cudnn", "sdpa", "attn", "attention")),
         ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas", "triton_tem", "mm_")),
         ("optimizer", ("multi_tensor", "adam", "foreach")),
         ("fused", ("triton",)))


def kind(name: str) -> str:
    low = name.lower()
    for label, keys in KINDS:
        if any(k in low for k in keys):
            return label
    return "other"


def child(name: str, spec: dict, steps: int, warmup: int) -> dict:
    import torch
    import torch._inductor.config as inductor

    from mlrepro.baseline import flops, probe
    from mlrepro.plan import models

    for key, value in spec.get("inductor", {}).items():
        setattr(inductor, key, value)
    shape = models.model("gpt-1.3b")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model, step = probe.build(shape, "bf16", spec["ga"], "bf16", spec["scope"], spec["mode"],
                              attention=spec.get("attention", "flash"))
    x = torch.randint(0, shape.vocab, (spec["mbs"], shape.seq), device="cuda")
    y = torch.roll(x, -1, 1)
    t = probe.timed_steps(step, x, y, warmup, steps)
    compile_s, dt = t["warmup_s"], t["step_s"]
    gbs = spec["mbs"] * spec["ga"]
    total = flops.megatron(shape, gbs)
    row = {"variant": name, **{k: v for k, v in spec.items() if k != "profile"}, "gpu": torch.cuda.get_device_name(0),
           "iter_time_s": round(dt, 4), "tflops": round(total / dt / 1e12, 1),
           "mfu_pct": round(100 * total / dt / 989e12, 2), "peak_gib": round(t["peak_bytes"] / 2**30, 2),
           "compile_s": round(compile_s, 1)}
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(x, y)
            torch.cuda.synchronize()
        by_kind: dict[str, float] = {}
        by_name: dict[str, list] = {}
        for e in prof.events():
            if e.device_type.name != "CUDA":
                continue
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            by_kind[kind(e.name)] = by_kind.get(kind(e.name), 0.0) + us
            by_name.setdefault(e.name, [0.0, 0])
            by_name[e.name][0] += us
            by_name[e.name][1] += 1
        busy = sum(by_kind.values())
        h, s, L = shape.hidden, shape.seq, shape.layers
        attn_flops = gbs * s * 6 * h * s * L
        gemm_flops = total - attn_flops
        row["profile"] = {
            "kernel_ms": round(busy / 1e3, 1), "step_ms": round(dt * 1e3, 1),
            "share_pct": {k: round(100 * v / busy, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "gemm_tflops": round(gemm_flops / (by_kind.get("gemm", 1) / 1e6) / 1e12, 1),
            "attention_tflops": round(attn_flops / (by_kind.get("attention", 1) / 1e6) / 1e12, 1),
            "top": [(n[:90], round(t / 1e3, 2), c, kind(n)) for n, (t, c) in
                    sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]],
        }
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default="best,cdt,maxat")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per variant")
    ap.add_argument("--out", default="variants.jsonl")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("ROW " + json.dumps(child(args.child, VARIANTS[args.child], args.steps, args.warmup)), flush=True)
        return 0
    rows = []
    for name in args.variants.split(","):
        t0 = time.monotonic()
        try:
            # a cache of its own: inductor's on-disk cache must not serve one variant's graph to another
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"inductor-{name}-")}
            proc = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(args.steps),
                                   "--warmup", str(args.warmup)], capture_output=True, text=True,
                                  timeout=args.timeout, env=env)
            found = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
            row = json.loads(found[0]) if found else {"variant": name, "error": proc.stderr[-600:]}
        except subprocess.TimeoutExpired:
            row = {"variant": name, "error": f"timeout after {args.timeout} s"}
        row["wall_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    print(f"\n{'variant':8} {'s/step':>7} {'TFLOP/s':>8} {'MFU %':>6} {'peak GiB':>8} {'compile s':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:8} error: {r['error'][-200:]}")
        else:
            print(f"{r['variant']:8} {r['iter_time_s']:7.4f} {r['tflops']:8.1f} {r['mfu_pct']:6.2f} "
                  f"{r['peak_gib']:8.2f} {r['compile_s']:9.1f}")
            if "profile" in r:
                p = r["profile"]
                print(f"         kernels {p['kernel_ms']} ms of {p['step_ms']} ms; {p['share_pct']}; "
                      f"GEMM {p['gemm_tflops']} TFLOP/s, attention {p['attention_tflops']} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
