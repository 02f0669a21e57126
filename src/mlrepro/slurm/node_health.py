"""Bad nodes of a reproduction: recorded once, kept out of every later seed, cleared by hand after repair.

A node is recorded when it fails a seed's quick preflight, or when an attempt on it fails for a
node-side reason (Slurm's NODE_FAIL or BOOT_FAIL, a GPU error in the run's log). The record is per
system (the nodes belong to the cluster, not to one benchmark), one JSON file:

    {"nodes": {"node2": {"node": "node2", "since": iso, "why": "...", "benchmark": "mini_lora",
                         "seed": 3, "attempt": 1, "job_id": "123", "source": "preflight"}}}

Every later seed's sbatch gets the recorded nodes in --exclude (beside the system's own
exclude_nodes); `mlrepro status` lists them; `mlrepro nodes clear NODE` removes one. Seeds run as
parallel Snakemake jobs, so writers take a lock: two seeds failing on one node record it once.
A plain job failure (FAILED, OUT_OF_MEMORY) is not node-side: it stays with the seed's own retry.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Mapping, Sequence

from mlrepro import paths
from mlrepro.util.fsutil import atomic_write_json, locked

FILE_NAME = "bad_nodes.json"
# Slurm states that name the node, not the job: the node died or never booted.
NODE_STATES = {"NODE_FAIL", "BOOT_FAIL"}
# The quick preflight's verdict on the node (mlrepro.launch, failure.json's state).
PREFLIGHT_STATE = "PREFLIGHT_FAILED"
# What a GPU says when it, not the program, is broken (driver Xid events, ECC, lost device).
GPU_ERROR = re.compile(r"\bXid\b|uncorrectable ECC|GPU has fallen off the bus|"
                       r"CUDA error: (?:an illegal memory access|unspecified launch failure|ECC)|"
                       r"NVRM:|cudaErrorECCUncorrectable", re.IGNORECASE)


def bad_nodes_file(root: Path, system: str) -> Path:
    """results/nodes/<system>/bad_nodes.json: the system's bad nodes."""
    return paths.bad_nodes_file(root, system)


def node_side(state: str | None, log_text: str = "") -> str | None:
    """Why an attempt's failure points at its node(s), or None when it does not."""
    if state in NODE_STATES:
        return f"Slurm job ended {state}"
    if state == PREFLIGHT_STATE:
        return "quick preflight failed"
    m = GPU_ERROR.search(log_text or "")
    if m:
        line = next((ln for ln in log_text.splitlines() if m.group(0) in ln), m.group(0))
        return f"GPU error in the run's log: {line.strip()[:200]}"
    return None


def blamed(nodes: Sequence[str], why: str, out_of_service: Mapping[str, str] | None) -> dict[str, str]:
    """The nodes a failure that points at a job's `nodes` (`why`, node_side's) is laid on: those of
    them Slurm has taken out of service (`out_of_service`: node -> its state), when it names any,
    else all of them. A 64-node job that ends NODE_FAIL lost one node, and the other 63 stay in use."""
    named = {node: f"{why}; Slurm has it {out_of_service[node]}" for node in nodes
             if node in (out_of_service or {})}
    return named or {node: why for node in nodes}


def read(path: Path) -> dict[str, dict]:
    """The recorded bad nodes, by name ({} when none); a damaged file is an error naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the bad-node record ({exc}); fix or delete it") from None
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        raise ValueError(f"{path}: no 'nodes' mapping; fix or delete it")
    return nodes


def excluded(path: Path) -> list[str]:
    """The node names every later seed's submission excludes."""
    return sorted(read(path))


def record(path: Path, node: str, why: str, *, benchmark: str | None = None, seed: int | None = None,
           attempt: int | None = None, job_id: str | None = None, source: str = "preflight",
           now: str | None = None) -> bool:
    """Record `node` as bad; False when it is recorded already (the first record stays)."""
    if not node or not isinstance(node, str):
        raise ValueError(f"not a node name: {node!r}")
    with locked(Path(path).with_suffix(".lock")):
        nodes = read(path)
        if node in nodes:
            return False
        nodes[node] = {"node": node, "since": now or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "why": why, "benchmark": benchmark, "seed": seed, "attempt": attempt, "job_id": job_id,
                       "source": source}
        atomic_write_json(Path(path), {"nodes": nodes})
    return True


def clear(path: Path, node: str | None = None) -> list[str]:
    """Forget `node` (after its repair), or every node when None; the names removed."""
    if not Path(path).is_file():
        return []
    with locked(Path(path).with_suffix(".lock")):
        nodes = read(path)
        if node is None:
            gone = sorted(nodes)
            nodes = {}
        elif node in nodes:
            gone = [node]
            del nodes[node]
        else:
            return []
        atomic_write_json(Path(path), {"nodes": nodes})
    return gone


def exclude_list(system_excludes: tuple[str, ...] | list[str], path: Path) -> tuple[str, ...]:
    """--exclude for a new submission: the system's own exclude_nodes, then the recorded bad nodes."""
    return tuple(system_excludes) + tuple(n for n in excluded(path) if n not in system_excludes)


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("list", "clear"), help="list the bad nodes, or clear one (or --all)")
    parser.add_argument("node", nargs="?", help="the node to clear, once it is repaired")
    parser.add_argument("--system", required=True, help="config/systems/<name>.yaml the reproduction runs on")
    parser.add_argument("--all", action="store_true", help="clear every node")
    parser.add_argument("--root", default=".", help="the checkout whose results/ holds the record")


def run(args) -> int:
    import sys

    path = bad_nodes_file(Path(args.root), args.system)
    try:
        nodes = read(path)
        if args.action == "list":
            for name, rec in sorted(nodes.items()):
                print(f"{name}\tsince {rec.get('since')}\t{rec.get('benchmark')} seed {rec.get('seed')}\t{rec.get('why')}")
            if not nodes:
                print(f"no bad nodes recorded for {args.system} ({path})")
            return 0
        if not args.node and not args.all:
            print("mlrepro nodes clear: name a node, or --all", file=sys.stderr)
            return 2
        gone = clear(path, None if args.all else args.node)
    except ValueError as exc:
        print(f"mlrepro nodes: {exc}", file=sys.stderr)
        return 2
    if not gone and args.all:
        print(f"no bad nodes recorded for {args.system}: nothing to clear")
        return 0
    if not gone:
        print(f"mlrepro nodes: {args.node} is not recorded as bad for {args.system} (recorded: "
              f"{', '.join(sorted(nodes)) or 'none'})", file=sys.stderr)
        return 1
    print(f"cleared: {', '.join(gone)}; later seeds may run on {'them' if len(gone) > 1 else 'it'} again")
    return 0
