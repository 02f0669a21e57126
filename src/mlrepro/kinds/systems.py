"""Which systems can run a benchmark, decided before any job starts.

A benchmark's `requires:` (scheduler, container runtime, GPUs) is known before its
implementation is fetched; once it is (and always for a local folder), one of its
config_<SYS>.sh files must also fit the system (kinds.mlperf.implementation_config); a
pretraining benchmark needs a layout the planner fits on it (kinds.megatron). A benchmark
asked of a system that cannot run it is refused with one message that names both and the
`--config system=<name>` values under config/systems/ that would fit.
"""

from __future__ import annotations

from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import kinds
from mlrepro.config import Benchmark, ConfigError, Settings, System
from mlrepro.kinds.mlperf import check_target, implementation_known
from mlrepro.scoring import checkers


def gpus(system: System) -> int:
    """GPUs one run can use: none on a local system that computes on the CPU."""
    if system.scheduler == "local" and system.device == "cpu":
        return 0
    return system.nodes * system.gpus_per_node


def unmet(root: Path, bench: Benchmark, system: System, *, with_implementation: bool) -> list[str]:
    """What `system` lacks to run `bench`; empty when it fits."""
    req = bench.requires
    missing = []
    if "scheduler" in req and system.scheduler not in req["scheduler"]:
        missing.append(f"it needs scheduler {' or '.join(req['scheduler'])} ({system.name} has {system.scheduler})")
    if "container_runtime" in req and system.container_runtime not in req["container_runtime"]:
        missing.append(f"it needs container runtime {' or '.join(req['container_runtime'])} "
                       f"({system.name} has {system.container_runtime})")
    if "gpus" in req and gpus(system) < req["gpus"]:
        have = "none, CPU only" if gpus(system) == 0 else f"{system.nodes} x {system.gpus_per_node}"
        missing.append(f"it needs at least {req['gpus']} GPUs ({system.name} has {have})")
    return missing + kinds.of(bench).unmet(root, bench, system, with_implementation=with_implementation)


def fitting_systems(root: Path, bench: Benchmark, *, with_implementation: bool) -> list[str]:
    """Names of the valid config/systems/*.yaml that can run `bench`."""
    names = []
    for path in sorted((Path(root) / "config" / "systems").glob("*.yaml")):
        try:
            system = mlrepro_config.load_system(Path(root), path.stem)
        except ConfigError:
            continue  # an unrelated broken system file is reported when it is used
        if not unmet(root, bench, system, with_implementation=with_implementation):
            names.append(path.stem)
    return names


def check(settings: Settings, name: str) -> Benchmark:
    """The benchmark, if the chosen system can run it; else ConfigError with the systems that can."""
    bench = settings.benchmark(name)
    check_ruleset(bench)
    known = implementation_known(settings.root, bench)
    missing = unmet(settings.root, bench, settings.system, with_implementation=known)
    if not missing:
        if known and not bench.is_pretrain:
            check_target(bench, settings.system)
        return bench
    system = settings.system
    fits = fitting_systems(settings.root, bench, with_implementation=known)
    if fits:
        advice = "Systems that fit: " + ", ".join(f"--config system={n}" for n in fits)
    else:
        advice = ("No system under config/systems/ fits: add config/systems/<name>.yaml for one that does "
                  "and pick it with --config system=<name>")
    raise ConfigError(f"{name} cannot run on system '{system.name}' (config/systems/{system.name}.yaml): "
                      f"{'; '.join(m.rstrip('.') for m in missing)}.\n{advice}.")


def check_ruleset(bench: Benchmark) -> None:
    """A ruleset the installed mlperf_logging does not have would fail only when the first seed is scored."""
    known = checkers.supported_rulesets()
    if bench.ruleset is not None and bench.ruleset not in known:
        raise ConfigError(f"config/benchmarks/{bench.name}.yaml: ruleset: mlperf_logging "
                          f"{checkers.mlperf_logging_version()} has no training ruleset '{bench.ruleset}' "
                          f"(it has {', '.join(sorted(known))})")
