"""Training FLOPs per iteration of a GPT, as Megatron-LM counts them, and MFU.

Megatron-LM's num_floating_point_operations (megatron/training/training.py, commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553, transformer_flops): every GEMM runs 3 times (forward,
wgrad, dgrad) at 2 FLOPs per multiply-add; per token and layer the QKV and output projections
(4h^2 with MHA), the MLP (2 x h x ffn, 3 with SwiGLU), the logits (h x V, once), and core
attention 3 x 2 x h x s / 2 x 2 = 6hs per token (QK^T and AV, halved for the causal mask). For
GPT (ffn 4h): 72 B s L h^2 (1 + s/(12h) + V/(12 L h)).

The baseline checklist's 16 B s L h^2 (1 + s/(6h)) is not that count: 16 is not 72 (it is 4.5x too low), it
drops the logit layer, and its s/(6h) counts the full, uncausal s x s score matrix (Narayanan et
al. 2021, whose 72 B s L h^2 (1 + s/(6h) + V/(12 L h)) it garbles). Flash attention computes only
the causal half, so Megatron's current count is the work done; MFU uses it.
"""

from __future__ import annotations

from mlrepro.plan.models import ModelShape


def megatron(shape: ModelShape, batch: int) -> float:
    """FLOPs of one training iteration over `batch` sequences (no recompute)."""
    h, s, L, V = shape.hidden, shape.seq, shape.layers, shape.vocab
    ffn_factor = 3 if shape.mlp == "swiglu" else 2
    attn_linear = h * (h + 2 * shape.kv_hidden) + h * h
    per_token = 6 * (L * (attn_linear + ffn_factor * h * shape.ffn_hidden) + h * V)
    core = 6 * h * s * L  # per token: 3 passes x 2 FLOPs x (QK^T + AV) x h x s / 2 (causal)
    return batch * s * (per_token + core)


def checklist_formula(shape: ModelShape, batch: int) -> float:
    """The baseline checklist's formula as it states it, kept to show the difference."""
    h, s, L = shape.hidden, shape.seq, shape.layers
    return 16 * batch * s * L * h * h * (1 + s / (6 * h))


def narayanan(shape: ModelShape, batch: int) -> float:
    """Narayanan et al. 2021 (appendix), the count the planner uses: full s x s attention."""
    h, s, L, V = shape.hidden, shape.seq, shape.layers, shape.vocab
    return 72 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
