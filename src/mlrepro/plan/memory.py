"""Peak memory per GPU of one layout: model state, activations, logits, buffers.

Model state (the baseline checklist; Megatron-LM's distributed-optimizer docs): weights in bf16 (2 B) or FP8
(1 B), fp32 main gradients (4 B), Adam's fp32 master copy, momentum and variance (12 B):
18 B per parameter, or 6 + 12/d with the optimizer sharded over the d = DP x CP ranks. LoRA
freezes the base weights: they cost their storage only, and the adapters carry the rest.

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), term by term so that each can change with the
architecture: for GPT, with dropout and TP t, sbh(10 + 24/t + 5as/(ht)) bytes; with sequence
parallelism everything is divided by t; selective recompute drops the attention-score term;
full recompute keeps only each layer's input. The same breakdown gives Llama's shape (SwiGLU's
two inputs, grouped-query K/V, no dropout) and LoRA's (a frozen linear needs no saved input).
The first pipeline stage holds min(PP, micro-batches) micro-batches in flight (1F1B), times
1 + (p-1)/(p v) with v interleaved stages; the last stage holds the logits.
"""

from __future__ import annotations

import dataclasses
import math

from mlrepro.plan.layout import Layout
from mlrepro.plan.workloads import Workload

GB = 1e9

# Cross entropy on bf16 logits: the logits (2 B), their fp32 copy and the fp32 softmax it keeps
# for the backward (4 + 4 B) per vocabulary entry and token (Megatron's vocab-parallel loss);
# Training.logit_bytes defaults to it.
LOGIT_BYTES = 10


@dataclasses.dataclass(frozen=True)
class Memory:
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.buffers

    def as_gb(self) -> dict[str, float]:
        return {k: v / GB for k, v in dataclasses.asdict(self).items()} | {"total": self.total / GB}


def layer_activation_bytes(w: Workload, lay: Layout) -> tuple[float, float]:
    """(bytes kept per layer per micro-batch, bytes live while that layer is recomputed).

    Korthikanti et al. 2022, per layer, s tokens, b sequences, h hidden, a heads, TP t:
    with dropout 34sbh + 5as^2b bytes without parallelism; sbh(10 + 24/t) + 5as^2b/t with TP;
    (34sbh + 5as^2b)/t with TP and sequence parallelism; selective recompute drops the
    attention-score term (5as^2b, or 2as^2b without dropout); full recompute keeps the layer
    input, 2sbh (/t with SP), and rebuilds one layer's full set during the backward.

    Dropout is an explicit assumption, `w.training.dropout` (workloads.Training; `mlrepro plan
    --dropout` for a GPT size). True: Korthikanti's figures as published, which store two hidden
    dropout masks (1 B per element each: the 34 includes 2sbh of them) and, with the attention
    scores materialised (flash_attention False), the attention-dropout mask and output (3 of the
    5as^2b). False (the planner's default, and the Megatron-LM arguments it writes:
    --attention-dropout 0 --hidden-dropout 0; the benchmarks are planned so too): 32sbh + 2as^2b.
    The last measured point (GPT-1.3B, MBS 4, scores materialised, one H200: 66.6 GB) is predicted
    at 67.5 GB without dropout and at 106.9 GB with it: that run stored no dropout masks, and the
    model matches it only under that assumption (tests/unit/plan/test_plan.py). Flash attention never
    stores the s x s scores, with or without dropout (it regenerates the mask from the RNG state).
    """
    m, tr = w.model, w.training
    h, hk, f, t = m.hidden, m.kv_hidden, m.ffn_hidden, lay.tp
    tokens = lay.mbs * m.seq / lay.cp
    frozen = m.lora_rank is not None
    lin_in = 1 if tr.fp8_linear_inputs else 2  # bytes of a saved linear input
    # Inputs that are whole on every TP rank unless sequence parallelism splits them.
    replicated = 2 * h + 2 * h  # the two norms' inputs
    replicated += 2 * h if frozen else lin_in * h  # QKV input (LoRA's adapter input is bf16)
    replicated += 0 if frozen else lin_in * h  # MLP input: a frozen fc1 needs none
    replicated += 2 * h if tr.dropout else 0  # two hidden-dropout masks (1 B each)
    # Split by TP always.
    sharded = 2 * h + 4 * hk  # Q, K, V
    sharded += 2 * h  # attention output (input of the output projection)
    act_in = (4 if m.mlp == "swiglu" else 2) * f  # GeLU input, or SwiGLU's gate and up
    sharded += act_in / 2 if lay.fp8_act else act_in
    sharded += 0 if frozen else lin_in * f  # input of fc2
    per_token = sharded / t + (replicated / t if lay.sp else replicated)
    scores = 0.0
    if not tr.flash_attention:  # softmax output (+ dropout mask and output), per head, s x s
        scores = (5 if tr.dropout else 2) * m.heads * (m.seq / lay.cp) / t
    full = tokens * (per_token + scores)
    if lay.recompute == "full":
        kept = tokens * 2 * h / (t if lay.sp else 1)
        return kept, full
    if lay.recompute == "selective":
        return tokens * per_token, 0.0
    return full, 0.0


def stage_params(w: Workload, lay: Layout) -> tuple[float, float]:
    """(all, trainable) parameters held by one GPU of the most loaded pipeline stage."""
    m = w.model
    if m.pipeline_extra_units:
        # Embedding and loss count as pipeline units; a stage holds at most units/pp layers' worth.
        layers = m.pipeline_units / lay.pp if lay.pp > 1 else m.layers
        total = layers * m.layer_params() + (0 if lay.pp > 1 else m.embedding_params() + m.output_params())
    else:
        layers = m.layers / lay.pp
        ends = m.embedding_params() + m.output_params() if lay.pp == 1 else max(
            m.embedding_params(), m.output_params() or m.vocab * m.hidden)
        total = layers * m.layer_params() + ends
    trainable = layers * m.lora_layer_params() if m.lora_rank else total
    return total / lay.tp, trainable / lay.tp


def inflight(lay: Layout) -> float:
    """Micro-batches' worth of layer activations the first pipeline stage holds at its peak."""
    if lay.pp == 1:
        return 1.0
    factor = 1 + (lay.pp - 1) / (lay.pp * lay.vpp) if lay.vpp > 1 else 1.0
    return min(lay.pp, lay.ga) * factor


def estimate(w: Workload, lay: Layout) -> Memory:
    """Peak memory of one GPU of the most loaded pipeline stage (the first: it holds min(PP, GA)
    micro-batches in flight under 1F1B, more when interleaved; or the last, which adds the logits).

    Activations per layer_activation_bytes, whose dropout assumption is `w.training.dropout`
    (default False: no dropout masks stored; see that function for the measured point behind it).
    """
    m, tr = w.model, w.training
    params, trainable = stage_params(w, lay)
    if m.lora_rank:
        weights = params * tr.param_bytes + trainable * 2
    else:
        weights = params * tr.param_bytes
    grads = trainable * tr.grad_bytes
    shards = lay.dp * lay.cp if tr.distributed_optimizer else 1
    optimizer = trainable * tr.optimizer_bytes / shards
    kept, transient = layer_activation_bytes(w, lay)
    layers_per_stage = math.ceil(m.pipeline_units / lay.pp) if lay.pp > 1 else m.layers
    first = kept * layers_per_stage * inflight(lay) + transient
    tokens = lay.mbs * m.seq / lay.cp
    logits = tokens * m.vocab * tr.logit_bytes / lay.tp
    last = kept * layers_per_stage + transient + logits
    if lay.pp == 1:
        activations, logit_part = kept * layers_per_stage + transient, logits
    elif first >= last:
        activations, logit_part = first, 0.0
    else:
        activations, logit_part = last - logits, logits
    return Memory(weights=weights, grads=grads, optimizer=optimizer, activations=activations,
                  logits=logit_part, buffers=tr.buffer_gb * GB)
