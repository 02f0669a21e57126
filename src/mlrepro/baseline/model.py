"""A GPT in plain PyTorch for the probe: fused QKV, no biases, causal attention through SDPA (flash or
cuDNN) or FlexAttention (a Triton kernel that torch.compile generates), tied embeddings, bf16 or fp32 residual."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlrepro.plan.models import ModelShape


def causal_block_mask(seq: int, device: torch.device):
    """FlexAttention's causal mask: the key blocks above the diagonal are skipped, not computed."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device=device)


# The backend is chosen inside the traced forward, not by the global torch.backends flags alone:
# the compiled graph then names its kernel, so torch.compile's on-disk cache cannot hand a graph
# traced with flash to a run that asked for cuDNN (seen on the H100: same cache key, wrong kernel).
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


class Block(nn.Module):
    def __init__(self, h: int, heads: int, ffn: int, attention: str = "sdpa", flex_mask=None):
        super().__init__()
        self.heads = heads
        self.backend = SDPA_BACKENDS.get(attention)
        self.flex_mask = flex_mask
        self.ln1 = nn.LayerNorm(h, bias=False)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.ln2 = nn.LayerNorm(h, bias=False)
        self.fc1 = nn.Linear(h, ffn, bias=False)
        self.fc2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if self.flex_mask is not None:
            from torch.nn.attention.flex_attention import flex_attention

            a = flex_attention(q, k, v, block_mask=self.flex_mask)
        elif self.backend is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([getattr(SDPBackend, self.backend)]):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, shape: ModelShape, residual_dtype: torch.dtype | None = None, attention: str = "sdpa"):
        super().__init__()
        # None: the residual stream stays in the embeddings' fp32 under autocast; bf16 halves its
        # traffic and its saved norm inputs (Megatron's default: fp32_residual_connection off).
        self.residual_dtype = residual_dtype
        self.wte = nn.Embedding(shape.vocab, shape.hidden)
        self.wpe = nn.Embedding(shape.seq, shape.hidden)
        # attention: "sdpa" (PyTorch picks), "flash" or "cudnn" (that SDPA backend), or "flex"
        mask = causal_block_mask(shape.seq, self.wte.weight.device) if attention == "flex" else None
        self.blocks = nn.ModuleList(Block(shape.hidden, shape.heads, shape.ffn_hidden, attention, mask)
                                    for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        if self.residual_dtype is not None:
            x = x.to(self.residual_dtype)
        for block in self.blocks:
            x = block(x)
        return self.loss(x, targets)

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
