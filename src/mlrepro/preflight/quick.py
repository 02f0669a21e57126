"""The seconds-long preflight each seed runs inside its allocation before training: a bad node fails the seed, named."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import tempfile
from pathlib import Path

from mlrepro.preflight import run
from mlrepro.util.fsutil import atomic_write_json

# config/preflight.yaml's defaults: the seed's run must not depend on the repository being readable.
SETTINGS = {"quick_seconds": 0.3, "compute_seconds": 0.3, "tp": None, "nccl_tests": None,
            "sweep": {"begin": 8, "end": 8, "factor": 2}}
RECORD = "preflight_quick.json"


def reason(host: dict) -> str | None:
    """Why this node must not train (its failing GPUs and checks, named), or None."""
    if host["verdict"] != "fail":
        return None
    bad = [f"GPU{g['index']} ({g['name']}): {g['why']}" for g in host["gpus"] if g["verdict"] == "fail"]
    bad += [f"{c['name']}: {c['why']}" for c in host["checks"] if c["verdict"] == "fail"]
    return f"preflight failed on {host['host']}: " + "; ".join(bad)


def check(out_dir: Path, per_node: bool = False) -> tuple[dict, str | None]:
    """Measure this node quickly, write out_dir/preflight_quick.json (with `per_node`, one file per node:
    the nodes of a Slurm attempt share its folder); (record, reason it failed or None)."""
    with tempfile.TemporaryDirectory(prefix="preflight-") as work:
        host = run.host_record(SETTINGS, None, Path(work), quick=True)
    host["host"] = node_name()
    if (fault := _injected(host["host"])) is not None:
        host["checks"].append(fault)
        host["verdict"] = "fail"
    atomic_write_json(node_record(out_dir) if per_node else out_dir / RECORD, host)
    return host, reason(host)


# A test's fault injection: the quick preflight fails on the nodes named here (comma-separated),
# so a bad node can be played without touching the cluster (its config, a drain).
FAIL_NODES_ENV = "MLREPRO_PREFLIGHT_FAIL_NODES"
PROLOG = "quick_preflight.sh"


def node_name() -> str:
    """This node as Slurm names it (--exclude takes that name), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _injected(node: str) -> dict | None:
    names = {n.strip() for n in os.environ.get(FAIL_NODES_ENV, "").split(",") if n.strip()}
    if node not in names:
        return None
    return {"name": "fault_injected", "verdict": "fail", "why": f"{node} is named in {FAIL_NODES_ENV}"}


def node_record(out_dir: Path) -> Path:
    """Where a node of a Slurm attempt writes its quick preflight (one file per node)."""
    return out_dir / f"preflight_quick_{node_name()}.json"


def task_prolog(logdir: Path, python: str) -> Path:
    """The script srun runs before each task (SLURM_TASK_PROLOG): the quick preflight on the node's first
    rank; a failing node fails its task, and with it the step. Its stdout would set the task's
    environment (Slurm's task prolog protocol), so everything goes to stderr."""
    script = logdir / PROLOG
    script.write_text(
        "#!/bin/bash\n"
        '[[ "${SLURM_LOCALID:-0}" == 0 ]] || exit 0\n'
        f'if [[ ! -x {shlex.quote(python)} ]]; then echo "mlrepro: no {python} on $(hostname): quick preflight '
        'skipped" >&2; exit 0; fi\n'
        f"exec {shlex.quote(python)} -m mlrepro.preflight.quick {shlex.quote(str(logdir))} >&2\n")
    script.chmod(0o700)
    return script


def failed_nodes(logdir: Path) -> list[tuple[str, str]]:
    """(node, why) of each node whose quick preflight failed in this attempt folder."""
    import json

    out = []
    for path in sorted(logdir.glob("preflight_quick_*.json")):
        try:
            host = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        why = reason(host)
        if why:
            out.append((host["host"], why))
    return out


def main(argv: list[str]) -> int:
    """`python -m mlrepro.preflight.quick DIR`: the task prolog's check of this node."""
    out_dir = Path(argv[1])
    host, why = check(out_dir, per_node=True)
    if why:
        print(f"mlrepro: {why}", file=sys.stderr)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
