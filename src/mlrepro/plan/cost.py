"""Step time of one layout: GEMMs at the rate the node reaches at the layout's own GEMM shapes,
attention, memory-bound work, TP/CP/PP/DP communication at the bus bandwidth of each message's
size, the pipeline bubble, and the per-micro-batch and per-step overheads a node shows.

FLOPs follow Narayanan et al. 2021 (appendix): a forward pass costs 2 FLOPs per weight and
token plus 4*b*s^2*h per layer for attention; the backward twice the forward, except that a
frozen weight (LoRA's base) needs only its input gradient, not its weight gradient. Full
recompute adds one more forward of every layer, selective recompute one of core attention.

The rates and constants come from `SystemFacts` (mlrepro.plan.hardware) in two forms:
- `Curves`, measured on the node: the GEMM sweep (TFLOP/s by m x n x k, mlrepro.preflight.gemm) and
  preflight's all_reduce sweep (bus bandwidth by message size). Without a sweep a GEMM runs at
  peak x MFU x `default_gemm_shape(flops)` (a curve that costs small GEMMs more, documented there);
  without an all_reduce sweep every message gets the system's plateau figure.
- `Tuning`, the few constants mlrepro.plan.calibration fits on measured steps of the same system:
  the share of the sweep's GEMM rate a training step reaches, memory-bound passes per layer, the
  pipeline's overhead per micro-batch per virtual stage, and a fixed cost per step. Unfitted, each
  has a named default (`Tuning.DEFAULTS`), and the plan lists which ones it used.

Communication time of a collective is bytes x 2(n-1)/n / busbw(size) for an all-reduce (the
nccl-tests definition of bus bandwidth); a group reaches over NVLink when the GPUs it spans
(Megatron's rank order: TP innermost, then CP, DP, PP) lie inside one NVLink domain. TP traffic
overlaps with compute only by the share a workload declares hidden (tp_comm_overlap); the DP
gradient reduce overlaps with the last micro-batch's backward where the workload overlaps it
(Megatron's --overlap-grad-reduce), except its last bucket. The 1F1B bubble adds (p-1)/v
micro-batch times to the m of a step.
"""

from __future__ import annotations

import dataclasses
import math

from mlrepro.plan import memory
from mlrepro.plan.layout import Layout
from mlrepro.plan.workloads import Workload

# A square 8192^3 product: the size preflight's matmul rate (and DESIGN.md's) is measured at.
REFERENCE_GEMM_FLOPS = 2.0 * 8192 ** 3
# Without a sweep: rate(F) ~ F / (F + HALF) (a fixed cost per GEMM of HALF / rate), normalised to
# the 8192^3 product. HALF is where the H200 sweep's GEMMs reach half their largest rate
# (docs/measurements/planner/h200x2_sweep; 2 GFLOP, a 1024^3 product, until it is in).
DEFAULT_GEMM_HALF_FLOPS = 2e9
# The share of the largest GEMMs' rate attention reaches (SDPA/flash counted as Megatron counts it,
# 4 b s^2 h forward, causal half not discounted); the GEMM rate itself until a sweep says otherwise.
ATTENTION_SHARE = 1.0
# Megatron's DDP buckets: max(40M, 1M x DP) parameters (DistributedDataParallelConfig.bucket_size);
# the message size the DP reduce runs at.
DP_BUCKET_PARAMS = 40_000_000
# Adam in fp32 (torch AdamW over Megatron's main params): read and write master weights, both moments
# (24 B), read the fp32 gradient (4 B), write the bf16 weight (2 B): memory-bound.
OPTIMIZER_BYTES_PER_PARAM = 30
# Megatron-LM's loss over the vocabulary, memory-bound: the logits cast to fp32, their maximum, exponent, sum,
# the division and the gradient's passes (tensor_parallel.vocab_parallel_cross_entropy, no fused kernel): fp32
# passes over tokens x vocabulary / TP per micro-batch. Measured in PyTorch profiler traces on one H200 at MBS 8
# (docs/measurements/planner/h200_profile): 12.7 passes for GPT-126M, 13.1 for GPT-1.3B, 9.9 and 10.3 ms a
# micro-batch, as much as GPT-126M's attention and linear layers' GEMMs take together.
LOSS_FP32_PASSES = 13.0
# The share of a layer's element-wise work that every TP rank repeats without sequence parallelism: the
# passes over the hidden-size activations (norms, residual adds, dropout); the rest (GeLU and biases over the
# FFN's and attention's sharded outputs) is split over the ranks. Measured on one H200: GPT-126M at TP1 with one
# TP2 rank's shapes runs 71% of the whole model's element-wise kernel time outside the loss (27.3 ms against
# 38.3 ms a step at MBS 8; docs/measurements/planner/h200_profile/halftp): f + (1 - f) / 2 = 0.71.
TP_REPLICATED_ELEMENTWISE = 0.43
# Device copy rate when preflight measured none: DESIGN.md section 8's H100 (2.98 TB/s), the slower one.
DEFAULT_COPY_TBPS = 2.98
# How the host's kernel launches and the GPU's work combine per micro-batch: (gpu^p + launch^p)^(1/p). A
# plain max (p -> inf) misses that both are paced by the same stream where they are close; p = 4 fits the
# 2x H200 sweep's MBS 1-8 rows of GPT-126M and GPT-1.3B (docs/measurements/planner/h200x2_sweep).
LAUNCH_OVERLAP_P = 4.0


@dataclasses.dataclass(frozen=True)
class Curves:
    """Rates measured on the node, looked up at the size each operation of a layout has."""

    gemm: tuple = ()  # ((m, n, k, tflops), ...) from the GEMM sweep
    allreduce: tuple = ()  # ((bytes, busbw GB/s), ...) inside a node, sizes ascending
    copy_tbps: float | None = None  # device copy, for the memory-bound terms
    gemm_source: str = ""
    allreduce_source: str = ""

    def gemm_tflops(self, m: int, n: int, k: int) -> float | None:
        """The sweep's rate for this shape: its own row, else the two nearest shapes (log-scale
        distance in m, n, k), weighted by inverse distance; None without a sweep."""
        if not self.gemm:
            return None
        point = (math.log2(m), math.log2(n), math.log2(k))
        near = sorted((math.dist(point, (math.log2(a), math.log2(b), math.log2(c))), t) for a, b, c, t in self.gemm)
        if near[0][0] < 1e-9:
            return near[0][1]
        pair = near[:2]
        weights = [1 / d for d, _ in pair]
        return sum(w * t for w, (_, t) in zip(weights, pair)) / sum(weights)

    def largest_gemm_tflops(self) -> float | None:
        if not self.gemm:
            return None
        top = sorted(self.gemm, key=lambda r: 2 * r[0] * r[1] * r[2])[-3:]
        return sorted(r[3] for r in top)[len(top) // 2]

    def busbw_gbs(self, nbytes: float) -> float | None:
        """The all_reduce bus bandwidth at this message size (interpolated on log size, clamped)."""
        rows = [(b, bw) for b, bw in self.allreduce if b > 0 and bw > 0]
        if not rows:
            return None
        x = math.log2(max(nbytes, 1.0))
        if x <= math.log2(rows[0][0]):
            return rows[0][1]
        for (b0, w0), (b1, w1) in zip(rows, rows[1:]):
            x0, x1 = math.log2(b0), math.log2(b1)
            if x <= x1:
                return w0 + (w1 - w0) * (x - x0) / (x1 - x0)
        return rows[-1][1]


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The constants a node's measured steps fit (mlrepro.plan.calibration); None: the default."""

    compute_scale: float | None = None  # share of the rate (sweep's, else peak x MFU) training GEMMs reach
    elementwise_passes: float | None = None  # bf16 passes over b*s*h per layer and micro-batch, fwd+bwd
    chunk_overhead_s: float | None = None  # per micro-batch per virtual pipeline stage (PP > 1)
    step_overhead_s: float | None = None  # per step: launch, synchronisation, what the terms miss
    launch_per_layer_s: float | None = None  # the host's launches per layer and micro-batch (fwd+bwd)
    source: str = ""  # where the fitted values come from
    basis: str = ""  # the rate compute_scale multiplies: "sweep" (GEMM sweep) or "mfu" (peak x MFU)

    # The defaults fold what is not itemized into the rate: an MFU measured on whole steps already
    # holds memory-bound work and overheads, and preflight's matmul rate becomes a step's rate at
    # STEP_SHARE_OF_MATMUL (mlrepro.plan.hardware; GPT-1.3B on H100: 0.704).
    DEFAULTS = {"compute_scale": None, "elementwise_passes": 0.0, "chunk_overhead_s": 0.0, "step_overhead_s": 0.0,
                "launch_per_layer_s": 0.0}
    WHY = {"compute_scale": "1 with peak x MFU; 0.704 of the GEMM sweep's rate (the H100 step/matmul share)",
           "elementwise_passes": "0: folded into the compute rate",
           "chunk_overhead_s": "0: none assumed",
           "step_overhead_s": "0: none assumed",
           "launch_per_layer_s": "0: the GPU's work assumed to hide the host's launches"}

    @property
    def fitted(self) -> bool:
        """Measured steps set these constants: memory-bound work and the optimizer are itemized."""
        return bool(self.source)

    def value(self, key: str) -> float | None:
        v = getattr(self, key)
        return self.DEFAULTS[key] if v is None else v

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in (*self.DEFAULTS, "source", "basis")}

    @classmethod
    def from_json(cls, record: dict | None) -> "Tuning | None":
        if not isinstance(record, dict):
            return None
        try:
            values = {k: (None if record.get(k) is None else float(record[k]))
                      for k in cls.DEFAULTS}
        except (TypeError, ValueError):
            return None
        return cls(**values, source=str(record.get("source") or ""), basis=str(record.get("basis") or ""))

    def figures(self) -> list[dict]:
        return [{"figure": k, "value": self.value(k) if self.value(k) is not None else "default",
                 "source": self.source if getattr(self, k) is not None else f"default ({self.WHY[k]})"}
                for k in self.DEFAULTS]


@dataclasses.dataclass(frozen=True)
class StepTime:
    compute: float  # seconds per step, all micro-batches, bubble included
    tp_comm: float
    cp_comm: float
    pp_comm: float
    dp_comm: float
    bubble: float  # fraction of the step the pipeline idles
    other: float = 0.0  # per-micro-batch and per-step overheads, the optimizer step
    gpu_busy: float = 0.0  # seconds a GPU works in the step (a profiler trace's busy time): its micro-batches'
    # kernels, the exposed DP reduce and the optimizer's kernels, not the bubble or the host's launches

    @property
    def total(self) -> float:
        return self.compute + self.tp_comm + self.cp_comm + self.pp_comm + self.dp_comm + self.other


def microbatch_flops(w: Workload, lay: Layout) -> float:
    """Training FLOPs of one micro-batch through the whole model (all GPUs together)."""
    linear, attention = _flops_split(w, lay)
    return linear + attention


def _flops_split(w: Workload, lay: Layout) -> tuple[float, float]:
    """(linear, core attention) training FLOPs of one micro-batch through the whole model."""
    m = w.model
    tokens = lay.mbs * m.seq
    linear_fwd = 2 * tokens * (m.layers * m.layer_params() + m.vocab * m.hidden)
    attention_fwd = 4 * lay.mbs * m.seq ** 2 * m.hidden * m.layers
    linear_passes = 2 if m.lora_rank else 3  # frozen weights: no weight gradient
    linear, attention = linear_passes * linear_fwd, 3 * attention_fwd
    if lay.recompute == "full":
        linear, attention = linear + linear_fwd, attention + attention_fwd
    elif lay.recompute == "selective":
        attention += attention_fwd
    return linear, attention


def model_flops_per_step(w: Workload, lay: Layout) -> float:
    """The FLOPs MFU counts (no recompute), for one global batch."""
    return microbatch_flops(w, dataclasses.replace(lay, recompute="none")) * lay.ga * lay.dp


def gemm_shapes(w: Workload, lay: Layout) -> list[tuple[str, int, int, int, float]]:
    """The forward GEMMs of one micro-batch on one GPU: (name, m, n, k, how many per micro-batch),
    the layer's four (Megatron's column- and row-parallel split by TP) on the GPU's layers, and the
    output layer's share of the pipeline (counted over the stages, as the FLOPs are)."""
    m = w.model
    tokens = lay.mbs * m.seq // lay.cp
    h, t = m.hidden, lay.tp
    fc1 = m.ffn_hidden * (2 if m.mlp == "swiglu" else 1)
    layers = m.layers / lay.pp
    return [("qkv", tokens, (h + 2 * m.kv_hidden) // t, h, layers), ("proj", tokens, h, h // t, layers),
            ("fc1", tokens, fc1 // t, h, layers), ("fc2", tokens, h, m.ffn_hidden // t, layers),
            ("logits", tokens, max(1, m.vocab // t), h, 1 / lay.pp)]


def default_gemm_shape(flops: float) -> float:
    """Share of the 8192^3 rate a GEMM of `flops` reaches without a sweep: F/(F+H) over the same at 8192^3."""
    def s(f):
        return f / (f + DEFAULT_GEMM_HALF_FLOPS)
    return s(flops) / s(REFERENCE_GEMM_FLOPS)


def _busbw(facts, span: int, nbytes: float) -> float:
    """Bus bandwidth (bytes/s) of a group whose ranks spread over `span` consecutive GPUs, for a
    message of `nbytes`: the node's measured curve inside it, else the system's figure."""
    if span <= facts.nvlink_domain:
        measured = facts.curves.busbw_gbs(nbytes) if facts.curves else None
        return (measured or facts.nvlink_busbw_gbs) * 1e9
    return facts.network_busbw_gbs * 1e9


def _allreduce(nbytes: float, n: int, busbw: float) -> float:
    return 0.0 if n <= 1 else nbytes * 2 * (n - 1) / n / busbw


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Seconds one micro-batch costs on one GPU, and the per-step costs."""

    compute: float
    tp_comm: float
    cp_comm: float
    pp_comm: float
    dp_comm: float  # exposed DP reduce per step
    overhead: float = 0.0  # per micro-batch slot: the pipeline's per-stage cost
    per_step_other: float = 0.0  # optimizer step and fixed cost per step
    launch: float = 0.0  # the host's time to launch a micro-batch's kernels on this stage
    per_step_gpu: float = 0.0  # the part of per_step_other the GPU works (the optimizer's kernels)

    @property
    def gpu(self) -> float:
        return self.compute + self.tp_comm + self.cp_comm + self.pp_comm

    @property
    def launch_excess(self) -> float:
        """What the host's launches add to a micro-batch: a smooth maximum of the GPU's work and the launches
        (LAUNCH_OVERLAP_P), so neither hides the other entirely where they are close."""
        if self.launch <= 0:
            return 0.0
        return (self.gpu ** LAUNCH_OVERLAP_P + self.launch ** LAUNCH_OVERLAP_P) ** (1 / LAUNCH_OVERLAP_P) - self.gpu

    @property
    def per_mb(self) -> float:
        return self.gpu + self.launch_excess + self.overhead

    def step_seconds(self, ga: int, pp: int, vpp: int) -> float:
        return (ga + (pp - 1) / vpp) * self.per_mb + self.dp_comm + self.per_step_other

    def step(self, ga: int, pp: int, vpp: int) -> StepTime:
        slots = ga + (pp - 1) / vpp
        return StepTime(compute=slots * self.compute, tp_comm=slots * self.tp_comm, cp_comm=slots * self.cp_comm,
                        pp_comm=slots * self.pp_comm, dp_comm=self.dp_comm, bubble=(pp - 1) / vpp / slots,
                        other=slots * (self.overhead + self.launch_excess) + self.per_step_other,
                        gpu_busy=ga * self.gpu + self.dp_comm + self.per_step_gpu)


def rates(facts) -> tuple[float, float, str]:
    """(the rate, TFLOP/s, a GEMM of 8192^3 gets in training, the compute scale, which basis) on these facts."""
    tuning = facts.tuning or Tuning()
    largest = facts.curves.largest_gemm_tflops() if facts.curves else None
    if largest:
        scale = tuning.compute_scale if tuning.compute_scale is not None else facts.step_share_of_matmul
        return largest, scale, "sweep"
    scale = tuning.compute_scale if tuning.compute_scale is not None else 1.0
    return facts.peak_tflops * facts.mfu, scale, "mfu"


def _gemm_seconds_per_flop(w: Workload, lay: Layout, facts) -> float:
    """Seconds per linear FLOP at this layout's GEMM shapes (the flop-weighted mean of 1/rate)."""
    reference, scale, basis = rates(facts)
    total = weighted = 0.0
    for _, m, n, k, count in gemm_shapes(w, lay):
        f = 2.0 * m * n * k * count
        if basis == "sweep":
            rate = facts.curves.gemm_tflops(m, n, k)
        else:
            rate = reference * default_gemm_shape(2.0 * m * n * k)
        total += f
        weighted += f / (rate * 1e12 * scale)
    return weighted / total


def microbatch(w: Workload, lay: Layout, facts, mfu: float | None = None) -> MicroBatch:
    """The parts of a step that do not depend on the number of micro-batches (lay.ga)."""
    m = w.model
    if mfu:
        facts = dataclasses.replace(facts, mfu=mfu, curves=dataclasses.replace(facts.curves or Curves(), gemm=()))
    tuning = facts.tuning or Tuning()
    reference, scale, _ = rates(facts)
    shards = lay.tp * lay.cp * lay.pp
    linear, attention = _flops_split(w, lay)
    t_mb = linear / shards * _gemm_seconds_per_flop(w, lay, facts)
    t_mb += attention / shards / (reference * 1e12 * scale * ATTENTION_SHARE)
    if lay.fp8_act:
        t_mb *= 1.01  # the extra cast of the SwiGLU input
    layers = m.layers / lay.pp
    tokens = lay.mbs * m.seq / lay.cp
    copy = ((facts.curves.copy_tbps if facts.curves else None) or DEFAULT_COPY_TBPS) * 1e12
    # Memory-bound work (norms, residuals, activations, dropout): without SP each TP rank repeats the share
    # over the hidden-size activations and splits the rest; SP splits it all.
    passes = tuning.value("elementwise_passes")
    replicated = 0.0 if lay.sp else TP_REPLICATED_ELEMENTWISE
    t_mb += passes * layers * tokens * m.hidden * 2 * (replicated + (1 - replicated) / lay.tp) / copy
    if tuning.fitted:
        # Measured steps itemize the loss (an MFU on whole steps holds it); spread over the stages as the
        # output layer's GEMM is.
        t_mb += LOSS_FP32_PASSES * tokens * m.vocab / (lay.tp * lay.pp) * 4 / copy
    # TP: two all-reduces (or all-gather + reduce-scatter with SP, the same bytes) forward and
    # two backward per layer; full recompute repeats the forward pair.
    collectives = 4 + (2 if lay.recompute == "full" else 0)
    message = tokens * m.hidden * 2
    tp_mb = layers * collectives * _allreduce(message, lay.tp, _busbw(facts, lay.tp, message))
    tp_mb *= 1 - w.training.tp_comm_overlap
    # CP (ring attention): each rank receives the other ranks' K and V forward, K, V and their
    # gradients backward: three passes of (cp-1) chunks.
    kv_chunk = tokens * 2 * m.kv_hidden * 2 / lay.tp
    cp_mb = 0.0 if lay.cp == 1 else layers * 3 * (lay.cp - 1) * kv_chunk / _busbw(facts, lay.tp * lay.cp, kv_chunk)
    # PP: a micro-batch's activations forward and their gradient backward, per virtual stage; a
    # send is priced at the all_reduce bus bandwidth of its size (NCCL's p2p uses the same links).
    pp_mb = 0.0
    overhead = 0.0
    if lay.pp > 1:
        act = tokens * m.hidden * 2 / (lay.tp if lay.sp else 1)
        pp_mb = 2 * lay.vpp * act / _busbw(facts, lay.tp * lay.cp * lay.dp * 2, act)
        overhead = lay.vpp * tuning.value("chunk_overhead_s")
    # The host launches every kernel of a micro-batch's forward and backward: a fixed time per layer, which
    # the GPU's work hides only when it is longer (2x H200, Megatron-LM's local implementation: about 3.7 ms
    # a layer, so GPT-126M at DP2 takes 0.362 s at MBS1 GA8 against 0.076 s at MBS8 GA1).
    launch = layers * tuning.value("launch_per_layer_s")
    # DP (with CP: gradients are reduced over both), once per step, in fp32, bucket by bucket.
    _, trainable = memory.stage_params(w, lay)
    group = lay.dp * lay.cp
    bucket = min(trainable, max(DP_BUCKET_PARAMS, 1_000_000 * group)) * 4
    dp = _allreduce(trainable * 4, group, _busbw(facts, lay.tp * lay.cp * lay.dp, bucket))
    if w.training.overlap_grad_reduce and dp:
        # Reduced while the last micro-batch's backward (2/3 of its compute) runs; its last bucket cannot be.
        last_bucket = dp * bucket / (trainable * 4)
        dp = max(dp - 2 / 3 * t_mb, last_bucket)
    optimizer = 0.0
    if tuning.fitted:
        # Measured steps itemize the optimizer (memory-bound; sharded over DP x CP by the distributed optimizer).
        owned = trainable / (group if w.training.distributed_optimizer else 1)
        optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / copy
    return MicroBatch(compute=t_mb, tp_comm=tp_mb, cp_comm=cp_mb, pp_comm=pp_mb, dp_comm=dp, overhead=overhead,
                      per_step_other=tuning.value("step_overhead_s") + optimizer, launch=launch,
                      per_step_gpu=optimizer)


def estimate(w: Workload, lay: Layout, facts, mfu: float | None = None) -> StepTime:
    return microbatch(w, lay, facts, mfu).step(lay.ga, lay.pp, lay.vpp)
