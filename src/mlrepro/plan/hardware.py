"""The facts about a system the planner needs, from config/systems/<name>.yaml.

`hardware:` in a system file carries datasheet figures (each file cites its sources);
preflight's measured figures, where they exist, can be passed instead.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mlrepro import config as mlrepro_config

# Plain compiled GPT-1.3B step on one H100, DESIGN.md section 8: 48.4% of 989 TFLOP/s. The
# planner's absolute times scale with it; rankings depend on it only through compute vs comms.
DEFAULT_MFU = 0.484


class HardwareUnknown(ValueError):
    """The system file lacks the figures the planner needs."""


@dataclasses.dataclass(frozen=True)
class SystemFacts:
    name: str
    nodes: int
    gpus_per_node: int
    gpu: str
    gpu_memory_gb: float
    peak_tflops: float  # dense bf16 tensor-core peak per GPU
    nvlink_domain: int  # GPUs that reach each other over NVLink (8 in a DGX, 72 in an NVL72 rack)
    nvlink_busbw_gbs: float  # all-reduce bus bandwidth inside the domain
    network_busbw_gbs: float  # all-reduce bus bandwidth across domains, per GPU
    mfu: float = DEFAULT_MFU
    platform: str = ""  # prefix of NVIDIA's config names (DGXB200, GB200, DGXH100)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_gpus(self, gpus: int) -> "SystemFacts":
        """The same kind of machine, `gpus` of them (whole nodes, or one partial node)."""
        if gpus < 1:
            raise ValueError("--gpus must be at least 1")
        if gpus <= self.gpus_per_node:
            return dataclasses.replace(self, nodes=1, gpus_per_node=gpus, nvlink_domain=min(self.nvlink_domain, gpus))
        if gpus % self.gpus_per_node:
            raise ValueError(f"{gpus} GPUs is not a whole number of {self.gpus_per_node}-GPU nodes of {self.name}")
        return dataclasses.replace(self, nodes=gpus // self.gpus_per_node)


_REQUIRED = ("gpu_memory_gb", "peak_tflops_bf16", "nvlink_domain_gpus", "nvlink_busbw_gbs", "network_busbw_gbs")


def from_system(system: mlrepro_config.System) -> SystemFacts:
    hw = dict(getattr(system, "hardware", None) or {})
    missing = [k for k in _REQUIRED if k not in hw]
    if missing:
        raise HardwareUnknown(
            f"system {system.name}: config/systems/{system.name}.yaml has no hardware.{', hardware.'.join(missing)}; "
            "the planner needs GPU memory, peak TFLOP/s, NVLink domain and bus bandwidths (datasheet figures)"
        )
    return SystemFacts(
        name=system.name, nodes=system.nodes, gpus_per_node=system.gpus_per_node, gpu=hw.get("gpu", "GPU"),
        gpu_memory_gb=float(hw["gpu_memory_gb"]), peak_tflops=float(hw["peak_tflops_bf16"]),
        nvlink_domain=int(hw["nvlink_domain_gpus"]), nvlink_busbw_gbs=float(hw["nvlink_busbw_gbs"]),
        network_busbw_gbs=float(hw["network_busbw_gbs"]), mfu=float(hw.get("mfu", DEFAULT_MFU)),
        platform=hw.get("platform", ""),
    )


def load(root: str | Path, name: str) -> SystemFacts:
    return from_system(mlrepro_config.load_system(Path(root).resolve(), name))


# A100 SXM (NVIDIA A100 datasheet: 40 or 80 GB HBM2/HBM2e, 312 TFLOP/s dense BF16, NVLink 3 at
# 600 GB/s bidirectional); busbw figures from seed 003's nccl-tests run on 8x A100 (313 GB/s) and
# HDR 200 Gb/s InfiniBand (~23 GB/s). Seed 002's table is for these machines; no system file
# describes them, so its report builds them here.
def a100(memory_gb: int, gpus: int) -> SystemFacts:
    facts = SystemFacts(name=f"a100-{memory_gb}gb", nodes=1, gpus_per_node=8, gpu=f"A100 {memory_gb}GB",
                        gpu_memory_gb=memory_gb, peak_tflops=312, nvlink_domain=8, nvlink_busbw_gbs=313,
                        network_busbw_gbs=23)
    return facts.with_gpus(gpus)


# Dense BF16 tensor-core peaks per GPU from the datasheets the system files cite (half the
# with-sparsity figure); matched against the name nvidia-smi or a log reports, longest key first.
DATASHEET_PEAK_BF16 = {"GB200": 2500.0, "B200": 2250.0, "H200": 989.0, "H100": 989.0, "A100": 312.0}


def datasheet_peak_tflops(gpu_name: str) -> float:
    """The dense BF16 peak of a GPU named like 'NVIDIA H100 80GB HBM3'; KeyError for an unknown one."""
    upper = gpu_name.upper()
    for key in sorted(DATASHEET_PEAK_BF16, key=len, reverse=True):
        if key in upper:
            return DATASHEET_PEAK_BF16[key]
    raise KeyError(f"no datasheet BF16 peak for GPU {gpu_name!r}; known: {', '.join(DATASHEET_PEAK_BF16)}")
