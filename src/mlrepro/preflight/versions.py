"""Software versions of this node (driver, CUDA, PyTorch, NCCL, cuDNN, TE, apex, Python) and their compatibility rules."""

from __future__ import annotations

import importlib.metadata as md
import platform
import re
import shutil
import subprocess

from mlrepro.preflight import NA

# Minimum Linux driver per CUDA major (CUDA Toolkit release notes, table "CUDA Toolkit and
# Minimum Required Driver Version" for minor-version compatibility): 11.x >= 450.80.02,
# 12.x >= 525.60.13, 13.x >= 580.65.06.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _vtuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


def parse_nvcc(text: str) -> str | None:
    """The release of `nvcc --version` output ("Cuda compilation tools, release 13.0, V13.0.88")."""
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def parse_smi_header(text: str) -> dict:
    """Driver and the CUDA version it supports, from plain `nvidia-smi` or `nvidia-smi -q` output."""
    out = {}
    for key, pattern in (("driver", r"Driver Version\s*:?\s*([\d.]+)"), ("driver_cuda", r"CUDA Version\s*:?\s*([\d.]+)")):
        m = re.search(pattern, text)
        out[key] = m.group(1) if m else None
    return out


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _dist(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def frozen_packages() -> list[str]:
    """name==version of each installed distribution, as `pip freeze` lists them: one per name, the
    one imports find (the first on sys.path; a copy further down, e.g. the image's own under a
    carried site folder, is shadowed and left out)."""
    seen: dict[str, str] = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            seen.setdefault(name.lower().replace("_", "-"), f"{name}=={d.version}")
    return sorted(seen.values(), key=str.lower)


def collect() -> dict:
    """What this node runs; GPU-side entries are "not applicable" without a GPU driver."""
    import torch

    smi = parse_smi_header(_run(["nvidia-smi", "-q"]) or "")
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    frozen = frozen_packages()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "driver": smi["driver"] or NA,
        "driver_cuda": smi["driver_cuda"] or NA,
        "nvcc": parse_nvcc(_run(["nvcc", "--version"]) or "") or NA,
        "transformer_engine": _dist("transformer_engine") or _dist("transformer-engine") or NA,
        "apex": _dist("apex") or NA,
        "packages": frozen,
    }


def compatibility(v: dict) -> list[dict]:
    """The version chain driver -> CUDA -> PyTorch -> NCCL checked; each failure says why."""
    checks = []

    def add(name, verdict, why):
        checks.append({"name": name, "verdict": verdict, "why": why})

    tcuda = v.get("torch_cuda")
    if v.get("driver") in (None, NA):
        add("driver_for_cuda", NA, "no NVIDIA driver on this node (CPU machine)")
        return checks
    if not tcuda:
        add("torch_cuda_build", "fail", f"PyTorch {v.get('torch')} is a CPU build; the node has driver {v['driver']}")
        return checks
    major = _vtuple(tcuda)[0]
    need = MIN_DRIVER.get(major)
    if need and _vtuple(v["driver"]) < _vtuple(need):
        add("driver_for_cuda", "fail", f"driver {v['driver']} is older than {need}, the minimum for CUDA {major}.x "
                                       f"(PyTorch is built for CUDA {tcuda})")
    elif _vtuple(v.get("driver_cuda")) and _vtuple(v["driver_cuda"])[:1] < _vtuple(tcuda)[:1]:
        add("driver_for_cuda", "fail", f"driver supports CUDA {v['driver_cuda']}, PyTorch needs CUDA {tcuda}")
    else:
        add("driver_for_cuda", "pass", f"driver {v['driver']} (CUDA {v.get('driver_cuda')}) runs PyTorch's CUDA {tcuda}")
    nvcc = v.get("nvcc")
    if nvcc in (None, NA):
        add("nvcc_matches_torch", "warn", "no nvcc: extensions (apex, nccl-tests) cannot be built on this node")
    elif _vtuple(nvcc)[0] != major:
        add("nvcc_matches_torch", "fail", f"nvcc {nvcc} and PyTorch's CUDA {tcuda} differ in major version: "
                                          "extensions built here will not load into PyTorch")
    else:
        add("nvcc_matches_torch", "pass", f"nvcc {nvcc}, PyTorch CUDA {tcuda}")
    add("nccl", "pass" if v.get("nccl") else "fail",
        f"NCCL {v['nccl']} inside PyTorch" if v.get("nccl") else "PyTorch has no NCCL: no multi-GPU collectives")
    te = v.get("transformer_engine")
    add("transformer_engine", "pass" if te not in (None, NA) else "warn",
        f"Transformer Engine {te}" if te not in (None, NA) else "no Transformer Engine: no fp8 runs on this node")
    return checks
