"""Causal attention kernels for the probe's shape, alone: which backend is fastest (issue 12).

GPT-1.3B's attention (32 heads of 64, seq 2048) at MBS 16, q/k/v laid out as the probe's fused QKV
makes them. Each backend: forward, and forward + backward, timed with CUDA events; TFLOP/s by
Megatron's count (causal half: 4 b h s^2 d / 2 forward, twice that backward). The first backend
is the reference the ratios are taken against.

    python benchmarks/baseline/attention_kernels.py [--mbs 16] [--iters 10]
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mbs", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    b, h, s, d = args.mbs, 32, 2048, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    fwd_flops = 4 * b * h * s * s * d / 2
    mask = create_block_mask(lambda b_, h_, q, kv: q >= kv, None, None, s, s, device="cuda")
    flex = torch.compile(flex_attention)

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return run

    backends = {"flash": sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                "efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION), "flex": lambda q, k, v: flex(q, k, v, block_mask=mask)}

    def timed(fn, backward: bool) -> float:
        for _ in range(3):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = fn(q, k, v)
            if backward:
                out.backward(grad)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = fn(q, k, v)
            if backward:
                out.backward(grad)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters / 1e3

    rows = []
    for name, fn in backends.items():
        try:
            f = timed(fn, False)
            fb = timed(fn, True)
            rows.append((name, f, fb - f))
        except Exception as exc:  # a backend this build or GPU lacks is a row, not the end
            rows.append((name, None, f"{type(exc).__name__}: {str(exc)[:120]}"))
    ref = next((r for r in rows if r[1] is not None), None)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"b={b} h={h} s={s} d={d} causal")
    print(f"{'backend':10} {'fwd ms':>8} {'fwd TFLOP/s':>11} {'bwd ms':>8} {'bwd TFLOP/s':>11} {'fwd+bwd vs ' + ref[0]:>16}")
    for name, f, bwd in rows:
        if f is None:
            print(f"{name:10} {bwd}")
            continue
        print(f"{name:10} {f * 1e3:8.2f} {fwd_flops / f / 1e12:11.1f} {bwd * 1e3:8.2f} {2 * fwd_flops / bwd / 1e12:11.1f} "
              f"{(ref[1] + ref[2]) / (f + bwd):16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
