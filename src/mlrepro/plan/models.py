"""Transformer shapes the planner knows, and their parameter counts.

Shapes are the published ones: Llama 2 70B and Llama 3.1 405B as NVIDIA's v5.0 MLPerf
implementations train them (sequence 8192), and the GPT-3 family (Brown et al. 2020,
table 2.1; sequence 2048, GPT-2 BPE vocabulary padded to 50,304 as Megatron-LM does) with
the sizes seeds 001-003 name: NeMo's gpt3/126m, Megatron-DeepSpeed's 125M/1.3B/13B/175B
(the Megatron-DeepSpeed guide) and the baseline checklist's 1.3B baseline, which uses 32 heads where the paper uses 24.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq: int
    mlp: str = "gelu"  # gelu (GPT: 2 matrices) | swiglu (Llama: 3 matrices)
    learned_positions: bool = True  # GPT's position table; Llama uses RoPE
    tied_embeddings: bool = True  # GPT ties the output layer to the input embedding
    lora_rank: int | None = None  # LoRA on the attention projections (qkv and out), base frozen
    # Pipeline units: NVIDIA's 405B config counts the embedding and the loss as one layer each
    # (ASYM_PP_EMBED, ASYM_PP_LOSS), so its 126 layers split into PP8 as 128 units.
    pipeline_extra_units: int = 0

    @property
    def kv_hidden(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def pipeline_units(self) -> int:
        return self.layers + self.pipeline_extra_units

    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        attention = h * (h + 2 * self.kv_hidden) + h * h
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        if self.mlp == "swiglu":
            norms = 2 * h  # RMSNorm: scale only, no biases
        else:
            norms = 4 * h + (h + 2 * self.kv_hidden) + h + f + h  # LayerNorm scale+bias, linear biases
        return attention + mlp + norms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    def output_params(self) -> int:
        """The output layer's own weights (none when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def total_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.output_params() + 2 * self.hidden

    def lora_layer_params(self) -> int:
        if not self.lora_rank:
            return 0
        h, r = self.hidden, self.lora_rank
        qkv_out = h + 2 * self.kv_hidden
        return r * (h + qkv_out) + r * (h + h)

    def trainable_params(self) -> int:
        return self.layers * self.lora_layer_params() if self.lora_rank else self.total_params()


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                      ffn_hidden=4 * hidden, vocab=50304, seq=2048)


LLAMA2_70B = ModelShape(name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                        vocab=32000, seq=8192, mlp="swiglu", learned_positions=False, tied_embeddings=False)
LLAMA2_70B_LORA = dataclasses.replace(LLAMA2_70B, name="llama2-70b-lora", lora_rank=16)
LLAMA31_405B = ModelShape(name="llama3.1-405b", layers=126, hidden=16384, heads=128, kv_heads=8,
                          ffn_hidden=53248, vocab=128256, seq=8192, mlp="swiglu", learned_positions=False,
                          tied_embeddings=False, pipeline_extra_units=2)

MODELS: dict[str, ModelShape] = {m.name: m for m in (
    LLAMA2_70B, LLAMA2_70B_LORA, LLAMA31_405B,
    _gpt("gpt-126m", 12, 768, 12),
    _gpt("gpt-350m", 24, 1024, 16),
    _gpt("gpt-760m", 24, 1536, 16),
    _gpt("gpt-1.3b", 24, 2048, 32),  # the baseline checklist's baseline shape
    _gpt("gpt-2.7b", 32, 2560, 32),
    _gpt("gpt-5b", 24, 4096, 32),  # NeMo gpt3/5b
    _gpt("gpt-6.7b", 32, 4096, 32),
    _gpt("gpt-13b", 40, 5120, 40),
    _gpt("gpt-20b", 44, 6144, 48),  # NeMo gpt3/20b
    _gpt("gpt-40b", 48, 8192, 64),  # NeMo gpt3/40b
    _gpt("gpt-175b", 96, 12288, 96),
    # NeMo's gpt3/7b_improved (the NeMo guide, "equivalent to an 8B"): SwiGLU FFN 10880, RoPE, no biases,
    # untied output layer, sequence 2048, GPT-2 BPE padded to 50,304.
    ModelShape(name="gpt-8b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=10880, vocab=50304,
               seq=2048, mlp="swiglu", learned_positions=False, tied_embeddings=False),
    # Not a published shape: a miniature GPT (2 layers, hidden 64, sequence 128; the others' GPT-2 BPE vocabulary,
    # so the same corpora feed it) that the GPT kinds train on CPU in the tests (tests/workflow/
    # test_megatron_deepspeed_cpu.py), about 25 ms an iteration on two cores.
    dataclasses.replace(_gpt("gpt-mini", 2, 64, 4), seq=128),
)}
ALIASES = {"gpt-125m": "gpt-126m", "gpt-7b-improved": "gpt-8b", "llama2_70b": "llama2-70b", "llama31_405b": "llama3.1-405b"}

# Global batch sizes of the GPT-3 paper (table 2.1), in sequences of 2048 tokens.
GPT_PAPER_GBS = {"gpt-126m": 256, "gpt-350m": 256, "gpt-760m": 256, "gpt-1.3b": 512, "gpt-2.7b": 512,
                 "gpt-5b": 1024, "gpt-6.7b": 1024, "gpt-13b": 1024, "gpt-20b": 1536, "gpt-40b": 1536, "gpt-8b": 512,
                 "gpt-175b": 1536}


def canonical(name: str) -> str:
    """The model's one name, whatever alias a config spells it with (gpt-125m is gpt-126m)."""
    return ALIASES.get(name.lower(), name.lower())


def model(name: str) -> ModelShape:
    key = canonical(name)
    if key not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[key]
