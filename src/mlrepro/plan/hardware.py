"""The facts about a system the planner needs: measured where the stages measured them, else the
datasheet figures of config/systems/<name>.yaml.

Measured figures (formats: BRIEF/DESIGN "shared record formats"):
- results/baseline/<system>/baseline.json: the compute rate, as the MFU a training step reached
  (the largest model's run: the planned models are larger still);
- results/preflight/<system>/preflight.json: the bf16 matmul TFLOP/s (the compute rate when no
  baseline ran), the all-reduce bus bandwidth inside a node (the plateau, and the sweep by message
  size: `curves`), the device copy rate, the GEMM sweep (mlrepro.preflight.gemm) and the GPU memory;
- results/plan/<system>/calibration.json: the constants mlrepro.plan.calibration fitted on the
  system's measured steps (`tuning`), used when they were fitted on the same basis (sweep or MFU).
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
from mlrepro.plan.cost import Curves, Tuning

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
    curves: Curves | None = dataclasses.field(default=None, compare=False)  # rates measured by size
    tuning: Tuning | None = dataclasses.field(default=None, compare=False)  # constants fitted on measured steps
    # figure -> where its value came from (datasheet, preflight, baseline, a command-line flag)
    sources: dict = dataclasses.field(default_factory=dict, compare=False)
    # The system's failures (its `failures:` block); None: a machine the planner prices without them.
    failures: goodput.FailureModel | None = dataclasses.field(default=None, compare=False)

    def figures(self) -> list[dict]:
        """The figures the plan rests on, each with its source (the plan's 'figures' table)."""
        values = {"gpu_memory_gb": self.gpu_memory_gb, "peak_tflops_bf16": self.peak_tflops, "mfu": self.mfu,
                  "nvlink_domain_gpus": self.nvlink_domain, "nvlink_busbw_gbs": self.nvlink_busbw_gbs,
                  "network_busbw_gbs": self.network_busbw_gbs}
        rows = [{"figure": k, "value": round(v, 4) if isinstance(v, float) else v,
                 "source": self.sources.get(k, "datasheet")} for k, v in values.items()]
        c = self.curves or Curves()
        rows.append({"figure": "gemm_rates", "value": len(c.gemm) or "default",
                     "source": c.gemm_source or "default (peak x MFU, small GEMMs costed by "
                                                "cost.default_gemm_shape: no GEMM sweep)"})
        rows.append({"figure": "allreduce_by_size", "value": len(c.allreduce) or "default",
                     "source": c.allreduce_source or "default (one bus bandwidth for every message size)"})
        rows += [{**r, "value": round(r["value"], 6) if isinstance(r["value"], float) else r["value"]}
                 for r in (self.tuning or Tuning()).figures()]
        return rows

    @property
    def step_share_of_matmul(self) -> float:
        return STEP_SHARE_OF_MATMUL

    def with_tuning(self, tuning: Tuning | None) -> "SystemFacts":
        return dataclasses.replace(self, tuning=tuning)

    def with_mfu(self, mfu: float, source: str) -> "SystemFacts":
        """An MFU given by hand prices compute at peak x MFU: the GEMM sweep and a fit on it are set aside."""
        curves = dataclasses.replace(self.curves or Curves(), gemm=(), gemm_source="")
        tuning = self.tuning if self.tuning and self.tuning.basis == "mfu" else None
        return dataclasses.replace(self, mfu=mfu, sources={**self.sources, "mfu": source}, curves=curves,
                                   tuning=tuning)

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
    facts = with_measured(facts, paths.read_json_if_exists(paths.preflight_json(root, system.name)),
                          paths.read_json_if_exists(paths.baseline_json(root, system.name)))
    return with_calibration(facts, paths.read_json_if_exists(paths.calibration_json(root, system.name)))


def basis(facts: SystemFacts) -> str:
    """What the compute rate rests on: the GEMM sweep, or peak x MFU."""
    return "sweep" if facts.curves and facts.curves.gemm else "mfu"


def with_calibration(facts: SystemFacts, record: dict | None) -> SystemFacts:
    """`facts` with the constants of calibration.json, when they were fitted on the basis these facts have."""
    tuning = Tuning.from_json((record or {}).get("tuning"))
    if tuning is None or tuning.basis != basis(facts):
        return facts
    return facts.with_tuning(tuning)


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
    if preflight:
        changes["curves"] = curves_of(preflight, where)
    return dataclasses.replace(facts, **changes, sources=sources)


def curves_of(preflight: dict, where: Path | str = "preflight.json") -> Curves:
    """The rates preflight measured by size: its all_reduce sweep (the median over hosts at each size),
    the device copy rate (the slowest GPU's) and its GEMM sweep (mlrepro.preflight.gemm: `gemm.rows`)."""
    by_size: dict[float, list[float]] = {}
    copies = []
    for host in preflight.get("hosts") or []:
        for a in host.get("allreduce") or []:
            size, bw = _number(a.get("bytes")), _number(a.get("busbw_gbps"))
            if size and bw:
                by_size.setdefault(size, []).append(bw)
        copies += [c for g in host.get("gpus") or [] if (c := _number(g.get("copy_tbps")))]
    allreduce = tuple((size, statistics.median(v)) for size, v in sorted(by_size.items()))
    gemm = gemm_rows((preflight.get("gemm") or {}).get("rows"))
    return Curves(gemm=gemm, allreduce=allreduce, copy_tbps=min(copies) if copies else None,
                  gemm_source=f"GEMM sweep, {len(gemm)} shapes ({where})" if gemm else "",
                  allreduce_source=f"preflight all_reduce sweep, {len(allreduce)} sizes ({where})" if allreduce else "")


def gemm_rows(rows) -> tuple:
    """(m, n, k, TFLOP/s) of a GEMM sweep's rows (mlrepro.preflight.gemm's record), the measured ones."""
    out = []
    for r in rows or []:
        if not isinstance(r, dict):
            continue
        dims = [r.get(k) for k in ("m", "n", "k")]
        rate = _number(r.get("tflops"))
        if rate and all(isinstance(d, int) and d > 0 for d in dims):
            out.append((*dims, rate))
    return tuple(out)


# A100 SXM (NVIDIA A100 datasheet, mlrepro.gpus: 40 or 80 GB HBM2/HBM2e, 312 TFLOP/s dense BF16,
# NVLink 3 at 600 GB/s bidirectional); busbw figures from the baseline checklist's nccl-tests run on 8x A100 (313 GB/s) and
# HDR 200 Gb/s InfiniBand (~23 GB/s). The Megatron-DeepSpeed guide's table is for these machines; no system file
# describes them, so its report builds them here.
def a100(memory_gb: int, gpus: int) -> SystemFacts:
    facts = SystemFacts(name=f"a100-{memory_gb}gb", nodes=1, gpus_per_node=8, gpu=f"A100 {memory_gb}GB",
                        gpu_memory_gb=memory_gb, peak_tflops=gpu_model("A100").peak_tflops_bf16, nvlink_domain=8,
                        nvlink_busbw_gbs=313, network_busbw_gbs=23)
    return facts.with_gpus(gpus)
