"""A config_<SYS>.sh for a system NVIDIA published none for: planned, then written beside the
published configs of the benchmark's implementation, so that the launcher picks it like any other.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro.implementation import configs as implementation
from mlrepro.plan import hardware, search, workloads, writer

log = logging.getLogger(__name__)


def is_generated(config_path: str | Path) -> bool:
    try:
        return writer.GENERATED_MARK in Path(config_path).read_text(errors="replace")
    except OSError:
        return False


def repository_root(benchmark: mlrepro_config.Benchmark) -> Path | None:
    """The repository the benchmark's config/benchmarks/<name>.yaml lives in (its results/ hold the measured figures)."""
    source = Path(benchmark.source)
    return source.parents[2] if source.parent.parent.name == "config" else None


def nearest_template(folder: Path, plan: search.Plan) -> Path | None:
    """The published config nearest to the plan's GPU count, the same platform first."""
    best = None
    for path in implementation.list_configs(folder) if Path(folder).is_dir() else []:
        if is_generated(path):
            continue
        shape = implementation.parse_name_shape(implementation.dgxsystem_of(path))
        if shape is None:
            continue
        key = (shape.platform != writer.platform_of(plan), abs(shape.nodes * shape.gpus_per_node - plan.facts.gpus),
               path.name)
        if best is None or key < best[0]:
            best = (key, path)
    return best[1] if best else None


def generate_config(benchmark: mlrepro_config.Benchmark, system: mlrepro_config.System) -> Path:
    """Plan the benchmark on the system and write the winner as a config_<SYS>.sh; return its path.

    Raises search.PlanError or hardware.HardwareUnknown (with the reason) when it cannot.
    """
    name = benchmark.mlperf_benchmark or benchmark.name
    if name not in workloads.BENCHMARKS:
        raise search.PlanError(f"the planner has no rules for {name} (it has: {', '.join(workloads.BENCHMARKS)})")
    plan = search.plan(workloads.BENCHMARKS[name], hardware.from_system(system, repository_root(benchmark)))
    template = nearest_template(benchmark.implementation_dir, plan)
    if template is None:
        raise search.PlanError(f"{benchmark.implementation_dir} has no published config to start from")
    path = writer.write_nvidia_config(plan, template.parent, template=template)
    log.info("generated %s for %s on %s: %s", path.name, benchmark.name, system.name, plan.layout.short())
    return path
