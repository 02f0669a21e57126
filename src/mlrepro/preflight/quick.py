"""The seconds-long preflight each seed runs inside its allocation before training: a bad node fails the seed, named."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

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


def check(out_dir: Path) -> tuple[dict, str | None]:
    """Measure this node quickly, write out_dir/preflight_quick.json; (record, reason it failed or None)."""
    from mlrepro.preflight import run

    with tempfile.TemporaryDirectory(prefix="preflight-") as work:
        host = run.host_record(SETTINGS, None, Path(work), quick=True)
    host.setdefault("host", socket.gethostname())
    atomic_write_json(out_dir / RECORD, host)
    return host, reason(host)
