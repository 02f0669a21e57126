"""A Megatron-LM GPT layer spec (for `--spec sdpa_spec sdpa_layer_spec`) whose core attention is torch SDPA.

Megatron-LM without Transformer Engine has only its unfused DotProductAttention (the s x s scores
materialised in HBM); PyTorch's scaled_dot_product_attention picks a flash kernel on Hopper, and it
ships with torch, so it can run where TE and flash-attn cannot be carried.
"""

import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPAttention(DotProductAttention):
    """DotProductAttention's interface ([s, b, n, h] in, [s, b, n*h] out) over torch SDPA."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        assert packed_seq_params is None and attention_bias is None
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        groups = q.size(1) // k.size(1)
        drop = self.config.attention_dropout if self.training else 0.0
        if mask_type == AttnMaskType.causal:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop,
                                                 scale=self.softmax_scale, enable_gqa=groups > 1)
        else:
            # Megatron's masks are True where attention is NOT allowed; SDPA's the opposite
            mask = None if attention_mask is None else ~attention_mask
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop,
                                                 scale=self.softmax_scale, enable_gqa=groups > 1)
        sq, b = query.size(0), query.size(1)
        return ctx.permute(2, 0, 1, 3).reshape(sq, b, -1)


sdpa_layer_spec = get_gpt_layer_local_spec()
sdpa_layer_spec.submodules.self_attention.submodules.core_attention = SDPAttention
