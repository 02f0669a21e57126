"""GPU datasheets: each model's peak, memory and bandwidths, and the figures measured on it.

A leaf: it imports nothing from mlrepro, so whoever needs a GPU's peak or bandwidth (preflight's
verdict, the baseline, the Megatron scorer, the planner's system facts) imports this alone.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """One GPU model's datasheet figures and the figures measured on it with plain PyTorch.

    Preflight judges a GPU against `measured_*` where they exist (stricter), else against the
    datasheet. busbw references are all_reduce bus bandwidths (GB/s) by GPU count and message size.
    """

    name: str
    match: tuple[str, ...]  # substrings of the name NVML reports
    memory_gib: float
    peak_tflops_bf16: float  # dense tensor-core peak
    hbm_tbps: float
    nvlink_gbs: float  # NVLink bandwidth per GPU, one direction (nccl-tests' busbw ceiling)
    # bf16 8192^3 matmul through torch, the median product in the power-capped steady state
    # (mlrepro.preflight.matmul), as the preflight measures it
    measured_matmul_tflops: float | None = None
    measured_copy_tbps: float | None = None  # device-to-device copy, torch
    measured_busbw_gbs: dict = dataclasses.field(default_factory=dict)  # {gpus: {bytes: GB/s}}


MIB = 1 << 20
# Datasheets: NVIDIA H100 (SXM5 80 GB HBM3, 3.35 TB/s, 989 dense BF16 TFLOP/s, NVLink 4 900 GB/s
# total = 450 per direction), H200 (141 GB HBM3e, 4.8 TB/s, same compute and NVLink), A100 SXM
# (80 GB, 2.04 TB/s, 312 TFLOP/s, NVLink 3 600 GB/s), B200 (180 GB, 8 TB/s, 2,250 dense BF16,
# NVLink 5 1.8 TB/s), GB200 (186 GB, 2,500 dense BF16). Measured: DESIGN.md section 8 (device machine, torch,
# 2026-11) for the copy and busbw. The matmul references are the steady state under the 700 W power cap,
# not DESIGN.md's 758 and 789: those are the mean of the first ten products after idle, run at the boost
# clock before the cap takes over (docs/measurements/multigpu: 787 burst, 652-676 steady on 2x H200; the
# issue's other 2x H200 node 655-664). H200: 660, the middle of four healthy GPUs on two nodes; H100: 680,
# issue 12's idle H100 (tests/fixtures/preflight/h100/preflight.json).
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("NVIDIA H100 80GB HBM3", ("H100",), 80, 989, 3.35, 450,
             measured_matmul_tflops=680, measured_copy_tbps=2.98),
    GpuModel("NVIDIA H200", ("H200",), 141, 989, 4.8, 450, measured_matmul_tflops=660, measured_copy_tbps=4.1,
             measured_busbw_gbs={2: {16 * MIB: 216, 256 * MIB: 299, 1024 * MIB: 322, 4096 * MIB: 343}}),
    GpuModel("NVIDIA A100-SXM4-80GB", ("A100",), 80, 312, 2.04, 300),
    GpuModel("NVIDIA GB200", ("GB200",), 186, 2500, 8.0, 900),  # before B200: "GB200" contains "B200"
    GpuModel("NVIDIA B200", ("B200",), 180, 2250, 8.0, 900),
)


def gpu_model(name: str | None) -> GpuModel | None:
    """The reference entry for a GPU name as NVML or nvidia-smi prints it; None when unknown."""
    if not name:
        return None
    upper = name.upper()
    return next((m for m in GPU_MODELS if any(s in upper for s in m.match)), None)


def datasheet_peak_tflops(gpu_name: str) -> float:
    """The dense BF16 peak of a GPU named like 'NVIDIA H100 80GB HBM3'; KeyError for an unknown one."""
    model = gpu_model(gpu_name)
    if model is None:
        raise KeyError(f"no datasheet BF16 peak for GPU {gpu_name!r}; known: {', '.join(m.name for m in GPU_MODELS)}")
    return model.peak_tflops_bf16
