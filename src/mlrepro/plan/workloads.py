"""What is being planned: a model, how it is trained (precision, optimizer), and its batch rules.

Two kinds: an MLPerf benchmark as NVIDIA's v5.0 implementation trains it, whose global batch
follows the implementation's rule GBS = MINIBS x DP and whose time to train is steps x step time
with the samples to converge at that batch size taken from MLCommons' reference convergence
points (RCPs); and a GPT pretraining run of a fixed global batch, where the step time is what
counts.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from mlrepro.plan import models
from mlrepro.scoring import checkers


@dataclasses.dataclass(frozen=True)
class Training:
    param_bytes: int = 2  # bf16 weights; 1 with FP8 parameters (NVIDIA's FP8_PARAMS / fp8_params)
    grad_bytes: int = 4  # Megatron keeps fp32 main gradients for bf16 training
    optimizer_bytes: int = 12  # Adam: fp32 master weights, momentum and variance
    distributed_optimizer: bool = True  # optimizer state sharded over the DP x CP ranks
    dropout: bool = False  # dropout masks and outputs stored (Korthikanti's 34 + 5as/h includes them)
    flash_attention: bool = True  # False: attention scores materialised (s^2 per head)
    fp8_linear_inputs: bool = False  # Transformer Engine FP8 keeps the inputs of linears in 1 byte
    fp8_act_knob: bool = False  # FP8_ACT: store the SwiGLU input in FP8 (NVIDIA's llama2 LoRA)
    buffer_gb: float = 1.0  # cuBLAS workspaces, communication staging, allocator slack
    # Bytes per vocabulary entry and token the loss keeps: 10 for Megatron's vocab-parallel cross
    # entropy (mlrepro.plan.memory.LOGIT_BYTES); a fused (compiled) loss keeps the bf16 logits and
    # their bf16 gradient only: 4 (the baseline probe, mlrepro.baseline.probe).
    logit_bytes: int = 10  # = memory.LOGIT_BYTES (memory imports this module)
    # Share of TP communication hidden behind GEMMs (Transformer Engine's userbuffers overlap,
    # which NVIDIA's configs turn on: TP_COMM_OVERLAP, MC_TP_OVERLAP_AG/RS). Plain Megatron: 0.
    tp_comm_overlap: float = 0.0
    # The DP gradient reduce runs during the backward pass (Megatron's --overlap-grad-reduce, which
    # mlrepro.pretrain.megatron_launch passes whenever DP > 1; NVIDIA's configs are priced without it).
    overlap_grad_reduce: bool = False


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    model: models.ModelShape
    training: Training
    mbs_choices: tuple[int, ...] = (1, 2, 4, 8)
    gbs: int | None = None  # fixed global batch (GPT); None: GBS = MINIBS x DP (benchmarks)
    mlperf_benchmark: str | None = None  # RCPs of this benchmark price the global batch
    ruleset: str = "5.0.0"
    writer: str = "megatron"  # megatron | nvidia
    # NVIDIA's variable names for the layout (llama2_70b_lora spells TP/PP/CP, 405b the long names)
    spellings: dict = dataclasses.field(default_factory=dict)
    # The 405B README: "GBS should be divisible by DP * VP" (VP = INTERLEAVED_PIPELINE).
    minibs_multiple_of_vpp: bool = False

    @property
    def fixed_gbs(self) -> bool:
        return self.gbs is not None

    def samples_to_converge(self, gbs: int) -> float | None:
        """Mean samples to converge at this batch size (RCP, interpolated), None beyond the largest RCP."""
        if not self.mlperf_benchmark:
            return None
        return _samples(self.mlperf_benchmark, self.ruleset, gbs)

    def largest_gbs(self) -> int | None:
        if not self.mlperf_benchmark:
            return None
        return int(_rcp_curve(self.mlperf_benchmark, self.ruleset)[0][-1])


@functools.cache
def _samples(benchmark: str, ruleset: str, gbs: int) -> float | None:
    sizes, means = _rcp_curve(benchmark, ruleset)
    if gbs > sizes[-1]:
        return None
    # Below the smallest reference batch, rcp_checker accepts a run only if it converges no
    # faster than that reference: its mean is the best a smaller batch can count on.
    return float(np.interp(gbs, sizes, means))


@functools.cache
def _rcp_curve(benchmark: str, ruleset: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    checker = checkers.rcp_checker_for(benchmark, ruleset)
    records = sorted(checker.rcp_data.values(), key=lambda r: r["BS"])
    return tuple(float(r["BS"]) for r in records), tuple(float(r["RCP Mean"]) for r in records)


# TE's userbuffers overlap hides most, not all, of TP's all-gathers and reduce-scatters; 0.8 is a
# planning figure (no measurement here), stated so that it can be replaced by a measured one.
TP_OVERLAP = 0.8

# NVIDIA v5.0 llama2_70b_lora (config_common.sh): FP8=True, which the NeMo config also uses as
# fp8_params; MBS=1; distributed optimizer; TE fused attention; LoRA r=16 on attention.
LLAMA2_70B_LORA = Workload(
    name="llama2_70b_lora", model=models.LLAMA2_70B_LORA,
    training=Training(param_bytes=1, fp8_linear_inputs=True, fp8_act_knob=True, tp_comm_overlap=TP_OVERLAP),
    mbs_choices=(1,), mlperf_benchmark="llama2_70b_lora", writer="nvidia",
    spellings={"tp": "TP", "pp": "PP", "cp": "CP", "sp": "SP", "vpp": None, "mbs": "MBS"},
)
# NVIDIA v5.0 llama31_405b (config_common.sh): FP8 with FP8_PARAMS=True, USE_DIST_OPTIMIZER=True,
# MICRO_BATCH_SIZE=1, interleaved pipeline (INTERLEAVED_PIPELINE).
LLAMA31_405B = Workload(
    name="llama31_405b", model=models.LLAMA31_405B,
    training=Training(param_bytes=1, fp8_linear_inputs=True, tp_comm_overlap=TP_OVERLAP),
    mbs_choices=(1,), mlperf_benchmark="llama31_405b", writer="nvidia",
    spellings={"tp": "TENSOR_MODEL_PARALLEL", "pp": "PIPELINE_MODEL_PARALLEL", "cp": "CONTEXT_PARALLEL",
               "sp": "SEQ_PARALLEL", "vpp": "INTERLEAVED_PIPELINE", "mbs": "MICRO_BATCH_SIZE"},
    minibs_multiple_of_vpp=True,
)
BENCHMARKS = {w.name: w for w in (LLAMA2_70B_LORA, LLAMA31_405B)}


def benchmark(name: str) -> Workload:
    if name not in BENCHMARKS:
        raise KeyError(f"no planning rules for benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def gpt(size: str, gbs: int | None = None, *, flash_attention: bool = True, dropout: bool = False,
        distributed_optimizer: bool = True) -> Workload:
    """Megatron-LM GPT pretraining in bf16 with Adam; GBS defaults to the GPT-3 paper's."""
    name = size if size.startswith("gpt-") else f"gpt-{size}"
    shape = models.model(name)
    if gbs is None:
        gbs = models.GPT_PAPER_GBS[shape.name]
    training = Training(dropout=dropout, flash_attention=flash_attention, distributed_optimizer=distributed_optimizer,
                        overlap_grad_reduce=True)
    return Workload(name=shape.name, model=shape, training=training, gbs=gbs)
