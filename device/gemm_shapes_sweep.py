"""The GEMM and attention shapes of GPT-126M and GPT-1.3B layers, timed on one GPU (issue 35's calibration input).

Recorded once on a lent node (device/multigpu_run.sh sweep) before the preflight measured them itself; the
planner's calibration reads the JSON this writes. Each row: the layer's GEMM (qkv, proj, fc1, fc2, logits) or
torch SDPA, the pass (fwd, dgrad, wgrad; sdpa: fwd, fwdbwd), the model, MBS and TP it belongs to, m x n x k,
seconds and TFLOP/s (bf16, CUDA events, median of the repeats after a warm-up).
Usage: python3 device/gemm_shapes_sweep.py OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F

MODELS = {"gpt-126m": dict(hidden=768, heads=12, ffn=3072, vocab=50304),
          "gpt-1.3b": dict(hidden=2048, heads=32, ffn=8192, vocab=50304)}
SEQ = 2048


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def gemm(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    s = timed(lambda: x @ w)
    return s, 2 * m * n * k / s / 1e12


def main(out):
    rows = []
    for name, d in MODELS.items():
        h, ffn, v = d["hidden"], d["ffn"], d["vocab"]
        for tp in (1, 2):
            for mbs in (1, 2, 4, 8, 16):
                t = mbs * SEQ
                for g, (k, n) in {"qkv": (h, 3 * h // tp), "proj": (h // tp, h), "fc1": (h, ffn // tp),
                                  "fc2": (ffn // tp, h), "logits": (h, v // tp)}.items():
                    # forward y = x W (t x k)(k x n); dgrad dx = dy W^T (t x n)(n x k); wgrad dW = x^T dy (k x t)(t x n)
                    for p, (mm, nn, kk) in {"fwd": (t, n, k), "dgrad": (t, k, n), "wgrad": (k, n, t)}.items():
                        s, tf = gemm(mm, nn, kk)
                        rows.append(dict(name=g, pass_=p, model=name, mbs=mbs, tp=tp, m=mm, n=nn, k=kk,
                                         seconds=s, tflops=tf))
                heads, hd = d["heads"] // tp, h // d["heads"]
                q, kk_, vv = (torch.randn(mbs, heads, SEQ, hd, device="cuda", dtype=torch.bfloat16,
                                          requires_grad=True) for _ in range(3))
                fl = 4 * mbs * heads * SEQ * SEQ * hd / 2  # causal: half the scores
                s = timed(lambda: F.scaled_dot_product_attention(q, kk_, vv, is_causal=True))
                rows.append(dict(name="sdpa", pass_="fwd", model=name, mbs=mbs, tp=tp, m=SEQ, n=SEQ, k=hd,
                                 seconds=s, tflops=fl / s / 1e12))
                s = timed(lambda: F.scaled_dot_product_attention(q, kk_, vv, is_causal=True).sum().backward())
                rows.append(dict(name="sdpa", pass_="fwdbwd", model=name, mbs=mbs, tp=tp, m=SEQ, n=SEQ, k=hd,
                                 seconds=s, tflops=3.5 * fl / s / 1e12))
                del q, kk_, vv
    for sq in (1024, 2048, 4096, 8192):
        s, tf = gemm(sq, sq, sq)
        rows.append(dict(name="square", pass_="fwd", model="", mbs=0, tp=1, m=sq, n=sq, k=sq, seconds=s, tflops=tf))
    for r in rows:
        r["pass"] = r.pop("pass_")
    json.dump({"gpu": torch.cuda.get_device_name(), "dtype": "bf16", "seq": SEQ, "torch": torch.__version__,
               "rows": rows}, open(out, "w"), indent=1)
    print(len(rows), "rows;", "square 8192:", rows[-1]["tflops"], "TFLOP/s")


if __name__ == "__main__":
    main(sys.argv[1])
