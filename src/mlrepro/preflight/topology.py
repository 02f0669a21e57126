"""`nvidia-smi topo -m` parsed into a GPU link matrix with CPU/NUMA affinity; TP groups checked against slow links."""

from __future__ import annotations

import re

# Link kinds from fastest to slowest (nvidia-smi topo -m legend). NV# is a bonded set of # NVLinks.
ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def _kind(link: str) -> str:
    return "NV" if re.fullmatch(r"NV\d+|NVL", link) else link


def parse(text: str) -> dict:
    """{"gpus": [...], "nics": [...], "matrix": {GPUi: {GPUj: link}}, "cpu_affinity": {GPUi: "0-31"},
    "numa_affinity": {GPUi: "0"}} from `nvidia-smi topo -m` (ANSI escapes and tabs tolerated)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln.rstrip() for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if header_at is None:
        raise ValueError("no `nvidia-smi topo -m` matrix header (a line starting with GPU0) found")
    header = re.split(r"\t+|\s{2,}", lines[header_at].strip())
    devices = [h for h in header if re.fullmatch(r"GPU\d+|NIC\d+|mlx\d+_\d+", h)]
    extra = header[len(devices):]  # CPU Affinity, NUMA Affinity, GPU NUMA ID
    topo = {"gpus": [d for d in devices if d.startswith("GPU")], "nics": [d for d in devices if not d.startswith("GPU")],
            "matrix": {}, "cpu_affinity": {}, "numa_affinity": {}}
    for ln in lines[header_at + 1:]:
        if not ln.strip() or ln.lstrip().startswith("Legend"):
            break
        cells = ln.split()
        row = cells[0]
        if row not in devices:
            continue
        links = cells[1:1 + len(devices)]
        topo["matrix"][row] = dict(zip(devices, links))
        rest = cells[1 + len(devices):]
        if row.startswith("GPU"):
            named = dict(zip(extra, rest))
            topo["cpu_affinity"][row] = named.get("CPU Affinity")
            topo["numa_affinity"][row] = named.get("NUMA Affinity")
    return topo


def link(topo: dict, a: int, b: int) -> str:
    return topo["matrix"][f"GPU{a}"][f"GPU{b}"]


def tp_groups(gpus: int, tp: int) -> list[list[int]]:
    """Megatron's TP groups on one node: consecutive ranks."""
    return [list(range(s, s + tp)) for s in range(0, gpus - gpus % tp, tp)]


def check_tp(topo: dict, tp: int) -> list[dict]:
    """One check per TP group: pass when every pair talks over NVLink, warn naming the slow pair otherwise,
    and warn when a group spans NUMA nodes."""
    checks = []
    n = len([g for g in topo["gpus"] if g in topo["matrix"]])
    if tp <= 1 or n < tp:
        return [{"name": f"tp{tp}_links", "verdict": "not applicable",
                 "why": f"TP {tp} on {n} GPU(s): no TP group inside this node"}]
    for group in tp_groups(n, tp):
        slow = [(a, b, link(topo, a, b)) for i, a in enumerate(group) for b in group[i + 1:]
                if _kind(link(topo, a, b)) != "NV"]
        numa = {topo["numa_affinity"].get(f"GPU{g}") for g in group} - {None, "N/A"}
        name = f"tp_group_{'_'.join(map(str, group))}"
        if slow:
            a, b, kind = max(slow, key=lambda s: ORDER.index(_kind(s[2])))
            checks.append({"name": name, "verdict": "warn",
                           "why": f"TP group {group} crosses a slow link: GPU{a}-GPU{b} is {kind} (no NVLink); "
                                  f"{len(slow)} pair(s) without NVLink"})
        elif len(numa) > 1:
            checks.append({"name": name, "verdict": "warn", "why": f"TP group {group} spans NUMA nodes {sorted(numa)}"})
        else:
            checks.append({"name": name, "verdict": "pass", "why": f"TP group {group}: all pairs over NVLink"})
    return checks
