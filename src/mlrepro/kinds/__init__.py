"""The kinds of benchmark behind one interface, `BenchmarkKind`: an MLPerf implementation
(kinds.mlperf), a Megatron-LM pretraining run (kinds.megatron) and a Megatron-DeepSpeed one
(kinds.megatron_deepspeed). `of(bench)` gives the
benchmark's kind; `KINDS` lists every kind, and tests/unit/kinds/test_kind_protocol.py checks each
against the interface. A new kind is a module here with the nine functions, added to `KINDS`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol, cast, runtime_checkable

from mlrepro.config import Benchmark, Settings, System
from mlrepro.launch.job import SeedPlan

# Every kind, by name. Imported when asked for: each kind pulls the planner (pandas, PuLP), and a
# stage process that imports this package runs one benchmark, so it needs at most one kind.
KINDS = {"mlperf": "mlrepro.kinds.mlperf", "megatron": "mlrepro.kinds.megatron",
         "megatron-deepspeed": "mlrepro.kinds.megatron_deepspeed"}


@runtime_checkable
class BenchmarkKind(Protocol):
    """What the workflow asks of a benchmark's kind; a kind is a module with these functions
    (a module satisfies a Protocol: `self` is not one of its functions' parameters)."""

    def plan_seed(self, settings: Settings, benchmark: str, seed: int) -> SeedPlan:
        """The plan the seed runs (mlrepro.launch.job)."""

    def dag_plan(self, settings: Settings, benchmark: str, seed: int) -> SeedPlan:
        """What `snakemake -n` shows and reserves for the seed (a placeholder while it cannot be known)."""

    def dag_plans(self, settings: Settings, benchmark: str) -> dict[int, SeedPlan]:
        """dag_plan of every listed seed of the benchmark, planned together."""

    def prepare(self, settings: Settings, benchmark: str, seed: int) -> SeedPlan:
        """The plan, with what it runs put in place (a Megatron seed's launch line or argument file)."""

    def implementation_folder(self, bench: Benchmark, system: System) -> Path:
        """The folder the seeds run and the image is built from."""

    def corpus_folder(self, root: Path, bench: Benchmark) -> Path | None:
        """The corpus whose blend the seeds read, if any."""

    def finish_seed(self, bench: Benchmark, plan: SeedPlan, run_log: Path, out: Path) -> None:
        """The run's log kept as the seed's result `out`, or SeedFailed with failure.json written."""

    def score_seed(self, settings: Settings, bench: Benchmark, seed: int, log_path: Path,
                   plan: SeedPlan | None) -> dict:
        """The seed's run record."""

    def unmet(self, root: Path, bench: Benchmark, system: System, *, with_implementation: bool) -> list[str]:
        """What the system lacks for the benchmark (kinds.systems asks)."""


def named(name: str) -> BenchmarkKind:
    """The kind called `name` (a key of KINDS)."""
    return cast(BenchmarkKind, importlib.import_module(KINDS[name]))


def of(bench: Benchmark) -> BenchmarkKind:
    """The benchmark's kind: a `pretrain:` block makes it a pretraining run, Megatron-DeepSpeed's where
    its launcher is megatron-deepspeed, else Megatron-LM's."""
    if not bench.is_pretrain:
        return named("mlperf")
    launcher = (getattr(bench, "pretrain", None) or {}).get("launcher")
    return named("megatron-deepspeed" if launcher == "megatron-deepspeed" else "megatron")
