"""Lay out runs as an MLPerf Training submission package.

    <out_dir>/<submitter>/systems/<system>.json
    <out_dir>/<submitter>/results/<system>/<benchmark>/result_<i>.txt

in the form ``python -m mlperf_logging.package_checker <out_dir>/<submitter>
training <ruleset>`` accepts: the result files hold only the clean MLLOG lines
of each run (rank prefixes and noise removed) and the system description has
every field the system_desc_checker requires.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlrepro.util.fsutil import atomic_dir
from mlrepro.scoring.mllog import parse_log
from mlrepro.scoring.rules import ALIASES, DEFAULT_RULESET, MLPERF_TARGETS

# Fields mlperf_logging's system_desc_checker requires (4.1.x, training).
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_memory_capacity",
    "host_storage_type", "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework", "other_software_stack",
    "operating_system", "sw_notes",
)
AVAILABILITY = ("Available on-premise", "Available cloud", "Research, Development, or Internal (RDI)", "Preview")


class PackageError(ValueError):
    """The inputs cannot make a valid package."""


def preflight_description(preflight: dict) -> dict:
    """System description fields measured by preflight (its preflight.json): GPU model, count and
    memory, software versions. Figures preflight could not take (null, "not applicable") are left out."""
    summary = preflight.get("summary") or {}

    def known(value) -> bool:
        return value not in (None, "", "not applicable") and not isinstance(value, (dict, list))

    def positive(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    out = {}
    if known(summary.get("gpu_model")):
        out["accelerator_model_name"] = str(summary["gpu_model"])
    if positive(summary.get("gpus_per_node")):
        out["accelerators_per_node"] = str(summary["gpus_per_node"])
    if positive(summary.get("gpu_memory_gib")):
        out["accelerator_memory_capacity"] = f"{summary['gpu_memory_gib']:.1f} GiB"
    versions = {k: v for k, v in (preflight.get("versions") or {}).items() if known(v)}
    if versions:
        out["other_software_stack"] = ", ".join(f"{k} {v}" for k, v in versions.items())
    return out


def write_submission_package(out_dir: str | os.PathLike, *, submitter: str, system_name: str, system_desc: dict,
                             benchmark: str, logs: list[str | os.PathLike], ruleset: str = DEFAULT_RULESET,
                             scaling_factor: float | None = None) -> dict:
    """Write the package (replacing `out_dir` atomically) and describe it.

    `system_desc` supplies the system description fields; `submitter`,
    `system_name`, division ("closed") and status ("Available on-premise")
    are filled in when absent, and fields still missing are written empty and
    listed under "empty_fields". `scaling_factor` > 1 (the RCP factor from
    score_runs) is written to scaling.json as in published packages.
    Returns {"root", "system_json", "results_dir", "result_files", "empty_fields"}.
    """
    bench = ALIASES.get(benchmark, benchmark)
    if bench not in MLPERF_TARGETS:
        raise PackageError(f"{benchmark} is not an MLPerf benchmark; only those have submission packages")
    for label, value in (("submitter", submitter), ("system name", system_name)):
        if not value or "/" in value or value.startswith("."):
            raise PackageError(f"{label} {value!r} cannot be a folder name")
    if not logs:
        raise PackageError("no logs to package")
    desc = {"submitter": submitter, "system_name": system_name, "division": "closed",
            "status": "Available on-premise", **(system_desc or {})}
    desc["submitter"], desc["system_name"] = submitter, system_name
    if desc["status"] not in AVAILABILITY:
        raise PackageError(f"system status {desc['status']!r} must be one of {', '.join(AVAILABILITY)}")
    empty = [f for f in SYSTEM_FIELDS if f not in desc]
    for f in empty:
        desc[f] = ""

    texts = []
    for p in logs:
        parsed = parse_log(p)
        if not parsed.records:
            raise PackageError(f"{p}: no MLLOG records ({'; '.join(parsed.problems)})")
        texts.append(parsed.to_bytes())

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        for old in sorted(tmp.rglob("*"), reverse=True):  # leftovers of an interrupted attempt
            old.unlink() if old.is_file() or old.is_symlink() else old.rmdir()
        root = tmp / submitter
        (root / "systems").mkdir(parents=True)
        (root / "systems" / f"{system_name}.json").write_text(json.dumps(desc, indent=4) + "\n")
        results = root / "results" / system_name / bench
        results.mkdir(parents=True)
        for i, data in enumerate(texts):
            (results / f"result_{i}.txt").write_bytes(data)
        if scaling_factor is not None and scaling_factor > 1:
            (results / "scaling.json").write_text(json.dumps({"scaling_factor": scaling_factor}))
    root = out_dir / submitter
    results = root / "results" / system_name / bench
    return {
        "root": str(root),
        "system_json": str(root / "systems" / f"{system_name}.json"),
        "results_dir": str(results),
        "result_files": [str(results / f"result_{i}.txt") for i in range(len(texts))],
        "empty_fields": empty,
        "ruleset": ruleset,
    }
