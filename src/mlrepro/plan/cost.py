"""Step time of one layout: compute at an MFU, TP/CP/PP/DP communication at a bus bandwidth,
and the pipeline bubble.

FLOPs follow Narayanan et al. 2021 (appendix): a forward pass costs 2 FLOPs per weight and
token plus 4*b*s^2*h per layer for attention; the backward twice the forward, except that a
frozen weight (LoRA's base) needs only its input gradient, not its weight gradient. Full
recompute adds one more forward of every layer, selective recompute one of core attention.
Communication time of a collective is bytes x 2(n-1)/n / busbw for an all-reduce (the nccl-tests
definition of bus bandwidth); a group reaches over NVLink when the GPUs it spans (Megatron's
rank order: TP innermost, then CP, DP, PP) lie inside one NVLink domain. Nothing is assumed to
overlap with compute except the share of TP communication a workload declares hidden
(tp_comm_overlap), which makes the estimate an upper bound that ranks communication-heavy
layouts conservatively. The 1F1B bubble adds (p-1)/v micro-batch times to the m of a step.
"""

from __future__ import annotations

import dataclasses

from mlrepro.plan import memory
from mlrepro.plan.hardware import SystemFacts
from mlrepro.plan.layout import Layout
from mlrepro.plan.workloads import Workload


@dataclasses.dataclass(frozen=True)
class StepTime:
    compute: float  # seconds per step, all micro-batches, bubble included
    tp_comm: float
    cp_comm: float
    pp_comm: float
    dp_comm: float
    bubble: float  # fraction of the step the pipeline idles

    @property
    def total(self) -> float:
        return self.compute + self.tp_comm + self.cp_comm + self.pp_comm + self.dp_comm


def microbatch_flops(w: Workload, lay: Layout) -> float:
    """Training FLOPs of one micro-batch through the whole model (all GPUs together)."""
    m = w.model
    tokens = lay.mbs * m.seq
    linear_fwd = 2 * tokens * (m.layers * m.layer_params() + m.vocab * m.hidden)
    attention_fwd = 4 * lay.mbs * m.seq ** 2 * m.hidden * m.layers
    linear_passes = 2 if m.lora_rank else 3  # frozen weights: no weight gradient
    flops = linear_passes * linear_fwd + 3 * attention_fwd
    if lay.recompute == "full":
        flops += linear_fwd + attention_fwd
    elif lay.recompute == "selective":
        flops += attention_fwd
    return flops


def model_flops_per_step(w: Workload, lay: Layout) -> float:
    """The FLOPs MFU counts (no recompute), for one global batch."""
    return microbatch_flops(w, dataclasses.replace(lay, recompute="none")) * lay.ga * lay.dp


def _busbw(facts: SystemFacts, span: int) -> float:
    """Bus bandwidth (bytes/s) of a group whose ranks spread over `span` consecutive GPUs."""
    inside = span <= facts.nvlink_domain
    return (facts.nvlink_busbw_gbs if inside else facts.network_busbw_gbs) * 1e9


def _allreduce(nbytes: float, n: int, busbw: float) -> float:
    return 0.0 if n <= 1 else nbytes * 2 * (n - 1) / n / busbw


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Seconds one micro-batch costs on one GPU, and the per-step DP reduction."""

    compute: float
    tp_comm: float
    cp_comm: float
    pp_comm: float
    dp_comm: float

    def step(self, ga: int, pp: int, vpp: int) -> StepTime:
        slots = ga + (pp - 1) / vpp
        return StepTime(compute=slots * self.compute, tp_comm=slots * self.tp_comm, cp_comm=slots * self.cp_comm,
                        pp_comm=slots * self.pp_comm, dp_comm=self.dp_comm, bubble=(pp - 1) / vpp / slots)


def microbatch(w: Workload, lay: Layout, facts: SystemFacts, mfu: float | None = None) -> MicroBatch:
    """The parts of a step that do not depend on the number of micro-batches (lay.ga)."""
    m = w.model
    mfu = mfu or facts.mfu
    per_gpu = microbatch_flops(w, lay) / (lay.tp * lay.cp * lay.pp)
    if lay.fp8_act:
        per_gpu *= 1.01  # the extra cast of the SwiGLU input
    t_mb = per_gpu / (facts.peak_tflops * 1e12 * mfu)
    layers = m.layers / lay.pp
    tokens = lay.mbs * m.seq / lay.cp
    # TP: two all-reduces (or all-gather + reduce-scatter with SP, the same bytes) forward and
    # two backward per layer; full recompute repeats the forward pair.
    collectives = 4 + (2 if lay.recompute == "full" else 0)
    tp_mb = layers * collectives * _allreduce(tokens * m.hidden * 2, lay.tp, _busbw(facts, lay.tp))
    tp_mb *= 1 - w.training.tp_comm_overlap
    # CP (ring attention): each rank receives the other ranks' K and V forward, K, V and their
    # gradients backward: three passes of (cp-1) chunks.
    kv_chunk = tokens * 2 * m.kv_hidden * 2 / lay.tp
    cp_mb = 0.0 if lay.cp == 1 else layers * 3 * (lay.cp - 1) * kv_chunk / _busbw(facts, lay.tp * lay.cp)
    # PP: a micro-batch's activations forward and their gradient backward, per virtual stage.
    pp_mb = 0.0
    if lay.pp > 1:
        act = tokens * m.hidden * 2 / (lay.tp if lay.sp else 1)
        pp_mb = 2 * lay.vpp * act / _busbw(facts, lay.tp * lay.cp * lay.dp * 2)
    # DP (with CP: gradients are reduced over both), once per step, in fp32.
    _, trainable = memory.stage_params(w, lay)
    dp = _allreduce(trainable * 4, lay.dp * lay.cp, _busbw(facts, lay.tp * lay.cp * lay.dp))
    return MicroBatch(compute=t_mb, tp_comm=tp_mb, cp_comm=cp_mb, pp_comm=pp_mb, dp_comm=dp)


def estimate(w: Workload, lay: Layout, facts: SystemFacts, mfu: float | None = None) -> StepTime:
    return microbatch(w, lay, facts, mfu).step(lay.ga, lay.pp, lay.vpp)
