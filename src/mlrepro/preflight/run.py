"""Run the preflight on this node and write preflight.json + env_checklist.md; the `mlrepro preflight` command."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from mlrepro import config, paths
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text
from mlrepro.preflight import NA, collectives, compute, gemm, gpus, report, topology, verdict, versions

log = logging.getLogger("mlrepro.preflight")

# Raw outputs kept next to preflight.json, so that a verdict can be re-read and parsers re-tested.
RAW = {"nvidia-smi-q.txt": ["nvidia-smi", "-q"], "topo-m.txt": ["nvidia-smi", "topo", "-m"],
       "query-gpu.csv": ["nvidia-smi", f"--query-gpu={gpus.QUERY}", "--format=csv,noheader,nounits"]}


def _raw(raw_dir: Path | None) -> dict[str, str]:
    texts = {}
    for name, cmd in RAW.items():
        try:
            texts[name] = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if raw_dir is not None:
            raw_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(raw_dir / name, texts[name])
    return texts


def host_record(settings: dict, expected_gpus: int | None, workdir: Path, raw_dir: Path | None = None,
                quick: bool = False) -> dict:
    """One node's record: GPUs with their verdicts, the all_reduce sweep, topology and checks."""
    why, found = gpus.collect()
    checks = []
    if why:
        # A system configured with GPUs whose node has no driver is broken, not a CPU machine.
        checks.append({"name": "gpus_visible", "verdict": "fail" if expected_gpus else NA,
                       "why": why + (f"; {expected_gpus} GPU(s) expected" if expected_gpus else "")})
    else:
        n = len(found)
        ok = expected_gpus is None or n >= expected_gpus
        checks.append({"name": "gpus_visible", "verdict": "pass" if ok else "fail",
                       "why": f"{n} GPU(s) visible" + ("" if ok else f", {expected_gpus} expected")})
    texts = _raw(raw_dir) if found else {}
    topo = {}
    if texts.get("topo-m.txt"):
        try:
            topo = topology.parse(texts["topo-m.txt"])
            checks += topology.check_tp(topo, settings.get("tp") or len(found))
        except ValueError as exc:
            checks.append({"name": "topology", "verdict": "warn", "why": str(exc)})
    seconds = settings["quick_seconds" if quick else "compute_seconds"]
    measured = compute.measure([g["index"] for g in found], seconds=seconds,
                               nvml={g["index"]: g.get("nvml_index", g["index"]) for g in found}) if found else {}
    own = {os.getpid()}
    rows = []
    for g in found:
        g.update(measured.get(g["index"], {}))
        g["verdict"], g["why"] = verdict.judge_gpu(g, gpus.health(g, own))
        rows.append(g)
    verdict.judge_peers(rows)
    allreduce = {"tool": NA, "rows": []}
    if len(found) >= 2 and not quick:
        s = settings["sweep"]
        allreduce = collectives.measure(len(found), collectives.sweep(s["begin"], s["end"], s["factor"]), workdir,
                                        settings.get("nccl_tests"))
    checks.append(verdict.judge_allreduce(allreduce["rows"], found[0]["name"] if found else None, len(found)))
    host = {"host": socket.gethostname(), "gpus": rows, "topology": topo, "checks": checks,
            "allreduce": [{"bytes": r["bytes"], "busbw_gbps": r["busbw_gbps"]} for r in allreduce["rows"]],
            "allreduce_tool": allreduce["tool"]}
    host["verdict"] = verdict.host_verdict(host)
    return host


def summary(hosts: list[dict]) -> dict:
    all_gpus = [g for h in hosts for g in h["gpus"]]
    if not all_gpus:
        return {"gpu_model": NA, "gpus_per_node": 0, "gpu_memory_gib": None, "matmul_bf16_tflops": None,
                "allreduce_busbw_gbps": None, "verdict": verdict.worst(h["verdict"] for h in hosts)}
    busbw = [r["busbw_gbps"] for h in hosts for r in h["allreduce"]]
    return {"gpu_model": all_gpus[0]["name"], "gpus_per_node": max(len(h["gpus"]) for h in hosts),
            "gpu_memory_gib": min(g["memory_gib"] for g in all_gpus),
            "matmul_bf16_tflops": min(g.get("matmul_bf16_tflops") or 0 for g in all_gpus),
            "allreduce_busbw_gbps": max(busbw) if busbw else None,
            "verdict": verdict.worst(h["verdict"] for h in hosts)}


def preflight(system: str, settings: dict, expected_gpus: int | None, out_dir: Path, quick: bool = False) -> dict:
    """Measure this node, judge it, write out_dir/preflight.json and env_checklist.md; return the record."""
    t0 = time.monotonic()
    v = versions.collect()
    with tempfile.TemporaryDirectory(prefix="preflight-") as work:
        host = host_record(settings, expected_gpus, Path(work), raw_dir=out_dir / "raw", quick=quick)
    host["checks"] = versions.compatibility(v) + host["checks"]
    host["verdict"] = verdict.host_verdict(host)
    doc = {"system": system, "hosts": [host], "versions": v, "summary": summary([host])}
    # The GEMM rates the planner prices a layout's shapes at (mlrepro.plan.cost); a quick check has no time for it.
    healthy = [g for g in host["gpus"] if g.get("verdict") != "fail"]
    doc["gemm"] = (gemm.sweep(healthy[0]["index"]) if healthy and not quick
                   else {"skipped": "skipped: quick check" if quick else gemm.why_not() or "skipped: no healthy GPU",
                         "rows": []})
    doc["seconds"] = round(time.monotonic() - t0, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "preflight.json", doc)
    atomic_write_text(out_dir / "env_checklist.md", report.checklist(doc))
    log.info("preflight %s: %s in %.0f s", system, doc["summary"]["verdict"], doc["seconds"])
    return doc


def load_settings(root: Path, path: Path | None = None) -> dict:
    """config/preflight.yaml, validated against workflow/schemas/preflight.schema.yaml."""
    path = path or root / "config" / "preflight.yaml"
    return config.validate(config.load_yaml(path), "preflight", str(path.relative_to(root) if path.is_relative_to(root) else path), root)


def add_arguments(parser) -> None:
    parser.add_argument("--system", default="local", help="config/systems/<name>.yaml (names the results folder)")
    parser.add_argument("--root", default=".", help="the repository (config/, workflow/schemas/)")
    parser.add_argument("--out", help="folder for preflight.json (default results/preflight/<system>)")
    parser.add_argument("--quick", action="store_true", help="the seconds-long subset a seed runs before training")
    parser.add_argument("--srun-allreduce", metavar="JSON",
                        help="be one rank of an all_reduce sweep across nodes (under `srun --ntasks-per-node=<gpus>`, "
                             "MASTER_ADDR set); rank 0 writes the rows to JSON")


def run(args) -> int:
    root = Path(args.root).resolve()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        system = config.load_system(root, args.system)
        settings = load_settings(root)
    except config.ConfigError as exc:
        print(f"error: {exc}")
        return 2
    if args.srun_allreduce:
        sweep = settings["sweep"]
        collectives.srun_sweep(collectives.sweep(sweep["begin"], sweep["end"], sweep["factor"]), Path(args.srun_allreduce))
        return 0
    out = Path(args.out) if args.out else paths.preflight_dir(root, args.system)
    expected = system.gpus_per_node if system.device == "cuda" else None
    doc = preflight(args.system, settings, expected, out, quick=args.quick)
    for h in doc["hosts"]:
        print(f"{h['host']}: {h['verdict']}")
        for g in h["gpus"]:
            print(f"  GPU{g['index']} {g['name']}: {g['verdict']} ({g['why']})")
        for c in h["checks"]:
            if c["verdict"] not in ("pass",):
                print(f"  {c['name']}: {c['verdict']} ({c['why']})")
    print(f"written: {out / 'preflight.json'}, {out / 'env_checklist.md'} ({doc['seconds']} s)")
    return 1 if doc["summary"]["verdict"] == "fail" else 0


def healthy_record(path: Path) -> dict:
    """The preflight record at `path`, for a stage that measures the node (both baseline workloads);
    RuntimeError when the node failed its preflight: no baseline is measured on a bad node."""
    import json

    pre = json.loads(Path(path).read_text())
    if pre["summary"]["verdict"] == "fail":
        raise RuntimeError(f"preflight failed on this system ({path}): no baseline on a bad node")
    return pre
