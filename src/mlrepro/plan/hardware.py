"""The facts about a system the planner needs: measured where the stages measured them, else the
datasheet figures of config/systems/<name>.yaml.

Measured figures (formats: BRIEF/DESIGN "shared record formats"):
- results/baseline/<system>/baseline.json: the compute rate, as the MFU a training step reached
  (the largest model's run: the planned models are larger still);
- results/preflight/<system>/preflight.json: the bf16 matmul TFLOP/s (the compute rate when no
  baseline ran), the all-reduce bus bandwidth inside a node and the GPU memory.
The network bandwidth across nodes is the datasheet's: preflight measures inside one host.
MFU is always counted against the datasheet peak, as the baseline checklist and MLPerf count it.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.gpus import gpu_model
from mlrepro.plan import goodput

# Plain compiled GPT-1.3B step on one H100, DESIGN.md section 8: 48.4% of 989 TFLOP/s. The
# planner's absolute times scale with it; rankings depend on it only through compute vs comms.
DEFAULT_MFU = 0.484
# Preflight's bf16 8192^3 matmul rate of a healthy H100 in the power-capped steady state is 680 TFLOP/s
# (gpus.GpuModel.measured_matmul_tflops), so that step ran at 479 / 680 = 70.4% of it: how preflight's
# matmul figure becomes an MFU.
STEP_SHARE_OF_MATMUL = DEFAULT_MFU * 989 / 680
GIB = 2 ** 30


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
    # figure -> where its value came from (datasheet, preflight, baseline, a command-line flag)
    sources: dict = dataclasses.field(default_factory=dict, compare=False)
    # The system's failures (its `failures:` block); None: a machine the planner prices without them.
    failures: goodput.FailureModel | None = dataclasses.field(default=None, compare=False)

    def figures(self) -> list[dict]:
        """The figures the plan rests on, each with its source (the plan's 'figures' table)."""
        values = {"gpu_memory_gb": self.gpu_memory_gb, "peak_tflops_bf16": self.peak_tflops, "mfu": self.mfu,
                  "nvlink_domain_gpus": self.nvlink_domain, "nvlink_busbw_gbs": self.nvlink_busbw_gbs,
                  "network_busbw_gbs": self.network_busbw_gbs}
        return [{"figure": k, "value": round(v, 4) if isinstance(v, float) else v,
                 "source": self.sources.get(k, "datasheet")} for k, v in values.items()]

    def with_mfu(self, mfu: float, source: str) -> "SystemFacts":
        return dataclasses.replace(self, mfu=mfu, sources={**self.sources, "mfu": source})

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


def from_system(system: mlrepro_config.System, root: str | Path | None = None) -> SystemFacts:
    """The system's figures; with `root` (the repository), the measured ones of its results/ where present."""
    facts = datasheet(system)
    if root is None:
        return facts
    # An absent or unreadable record leaves the datasheet's figures in place.
    return with_measured(facts, paths.read_json_if_exists(paths.preflight_json(root, system.name)),
                         paths.read_json_if_exists(paths.baseline_json(root, system.name)))


def datasheet(system: mlrepro_config.System) -> SystemFacts:
    """The figures of the system file's hardware: block (and the default MFU)."""
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
        sources={k: f"datasheet (config/systems/{system.name}.yaml)" for k in _REQUIRED}
        | {"mfu": f"config/systems/{system.name}.yaml" if "mfu" in hw else f"default ({DEFAULT_MFU:g}: GPT-1.3B on H100)"},
        failures=goodput.FailureModel.of(getattr(system, "failures", None), f"config/systems/{system.name}.yaml"),
    )


def load(root: str | Path, name: str, *, measured: bool = True) -> SystemFacts:
    """The system's figures; with `measured`, those of <root>/results/{preflight,baseline} where present."""
    root = Path(root).resolve()
    return from_system(mlrepro_config.load_system(root, name), root if measured else None)


def _number(value) -> float | None:
    """A positive measured figure, or None for null, "not applicable" and the like."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def baseline_run(baseline: dict | None) -> dict | None:
    """The baseline run whose MFU the planner uses: the largest model measured (by FLOPs/s x time
    per sample, i.e. FLOPs per sample), among runs that report an MFU or TFLOP/s."""
    runs = [r for r in (baseline or {}).get("runs") or []
            if isinstance(r, dict) and (_number(r.get("mfu")) or _number(r.get("tflops_per_gpu")))]
    if not runs:
        return None

    def size(r: dict) -> float:
        tflops, rate = _number(r.get("tflops_per_gpu")), _number(r.get("samples_per_s"))
        return tflops / rate if tflops and rate else 0.0

    return max(runs, key=size)


def _allreduce_busbw(preflight: dict) -> float | None:
    summary = _number((preflight.get("summary") or {}).get("allreduce_busbw_gbps"))
    if summary:
        return summary
    # No summary figure: the median over hosts of each host's largest message (its plateau).
    largest = []
    for host in preflight.get("hosts") or []:
        sizes = [a for a in host.get("allreduce") or [] if _number(a.get("busbw_gbps")) and _number(a.get("bytes"))]
        if sizes:
            largest.append(float(max(sizes, key=lambda a: a["bytes"])["busbw_gbps"]))
    return statistics.median(largest) if largest else None


def with_measured(facts: SystemFacts, preflight: dict | None, baseline: dict | None) -> SystemFacts:
    """`facts` with the figures preflight and the baseline stage measured in place of the datasheet's."""
    changes, sources = {}, dict(facts.sources)
    pre = (preflight or {}).get("summary") or {}
    where = paths.preflight_json(Path(), facts.name)  # relative: results/preflight/<system>/preflight.json
    memory_gib = _number(pre.get("gpu_memory_gib"))
    if memory_gib:
        changes["gpu_memory_gb"] = memory_gib * GIB / 1e9
        sources["gpu_memory_gb"] = f"preflight ({memory_gib:g} GiB; {where})"
    busbw = _allreduce_busbw(preflight) if preflight else None
    if busbw and facts.gpus_per_node > 1:
        changes["nvlink_busbw_gbs"] = busbw
        sources["nvlink_busbw_gbs"] = f"preflight (all-reduce busbw inside a node; {where})"
    matmul = _number(pre.get("matmul_bf16_tflops"))
    run = baseline_run(baseline)
    if run is not None:
        tflops = _number(run.get("tflops_per_gpu"))
        changes["mfu"] = tflops / facts.peak_tflops if tflops else float(run["mfu"])
        sources["mfu"] = (f"baseline ({run.get('model')} {run.get('precision') or ''} "
                          f"{tflops or 0:.0f} TFLOP/s per GPU; {paths.baseline_json(Path(), facts.name)})")
    elif matmul:
        changes["mfu"] = matmul * STEP_SHARE_OF_MATMUL / facts.peak_tflops
        sources["mfu"] = f"preflight (bf16 matmul {matmul:g} TFLOP/s x {STEP_SHARE_OF_MATMUL:.3f}; {where})"
    return dataclasses.replace(facts, **changes, sources=sources)


# A100 SXM (NVIDIA A100 datasheet, mlrepro.gpus: 40 or 80 GB HBM2/HBM2e, 312 TFLOP/s dense BF16,
# NVLink 3 at 600 GB/s bidirectional); busbw figures from the baseline checklist's nccl-tests run on 8x A100 (313 GB/s) and
# HDR 200 Gb/s InfiniBand (~23 GB/s). The Megatron-DeepSpeed guide's table is for these machines; no system file
# describes them, so its report builds them here.
def a100(memory_gb: int, gpus: int) -> SystemFacts:
    facts = SystemFacts(name=f"a100-{memory_gb}gb", nodes=1, gpus_per_node=8, gpu=f"A100 {memory_gb}GB",
                        gpu_memory_gb=memory_gb, peak_tflops=gpu_model("A100").peak_tflops_bf16, nvlink_domain=8,
                        nvlink_busbw_gbs=313, network_busbw_gbs=23)
    return facts.with_gpus(gpus)
