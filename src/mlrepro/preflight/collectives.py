"""all_reduce bus bandwidth the nccl-tests way (busbw = algbw x 2(n-1)/n) over the baseline checklist's size sweep.

Two measurements, same numbers: nccl-tests' all_reduce_perf, built from source at NCCL_TESTS_COMMIT
where a CUDA toolchain and the source are present, or torch.distributed's all_reduce (NCCL backend)
otherwise. Across nodes the same worker runs under srun (RANK/WORLD_SIZE from SLURM_* variables).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from mlrepro.preflight import NA

NCCL_TESTS_REPO = "https://github.com/NVIDIA/nccl-tests"
NCCL_TESTS_COMMIT = "v2.17.6"  # pinned tag; the build is `make -j src.build CUDA_HOME=... NCCL_HOME=...`


def sweep(begin: int = 8, end: int = 128 << 20, factor: int = 2) -> list[int]:
    """Message sizes of `all_reduce_perf -b 8 -e 128M -f 2` (the baseline checklist)."""
    sizes, s = [], begin
    while s <= end:
        sizes.append(s)
        s *= factor
    return sizes


def busbw(algbw_gbps: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce over n ranks (doc/PERFORMANCE.md)."""
    return algbw_gbps * 2 * (n - 1) / n


def parse_nccl_tests(text: str) -> list[dict]:
    """[{"bytes", "algbw_gbps", "busbw_gbps", "time_us"}] of all_reduce_perf's out-of-place columns,
    located by its own header line (the columns differ between nccl-tests versions)."""
    cols = None
    rows = []
    for line in text.splitlines():
        if line.startswith("#") and "busbw" in line and "size" in line:
            cols = line.lstrip("#").split()
            continue
        fields = line.split()
        if cols is None or not fields or not fields[0].isdigit() or len(fields) < len(cols):
            continue
        rec = dict(zip(cols, fields))  # the first time/algbw/busbw are out-of-place; zip keeps the last, so:
        first = {c: fields[i] for i, c in reversed(list(enumerate(cols)))}
        rows.append({"bytes": int(rec["size"]), "time_us": float(first["time"]),
                     "algbw_gbps": float(first["algbw"]), "busbw_gbps": float(first["busbw"])})
    return rows


def build_nccl_tests(source: Path, cuda_home: str, nccl_home: str | None, timeout: int = 600) -> Path:
    """all_reduce_perf built from a checkout of NCCL_TESTS_REPO at NCCL_TESTS_COMMIT."""
    args = ["make", "-j", str(os.cpu_count() or 4), "src.build", f"CUDA_HOME={cuda_home}"]
    if nccl_home:
        args.append(f"NCCL_HOME={nccl_home}")
    subprocess.run(args, cwd=source, check=True, timeout=timeout, capture_output=True)
    return source / "build" / "all_reduce_perf"


def run_nccl_tests(binary: Path, gpus: int, begin="8", end="128M", factor="2", timeout: int = 300) -> list[dict]:
    out = subprocess.run([str(binary), "-b", begin, "-e", end, "-f", factor, "-g", str(gpus)],
                         capture_output=True, text=True, timeout=timeout, check=True).stdout
    return parse_nccl_tests(out)


def _time_allreduce(dist, torch, nbytes: int, warmup: int, iters: int, device: str) -> float:
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(x)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    return (time.perf_counter() - t0) / iters


def worker(rank: int, world: int, init: str, sizes: list[int], out: str | None, local_rank: int | None = None,
           backend: str = "nccl") -> list[dict]:
    """One rank of the torch.distributed sweep (NCCL on GPUs; gloo on CPUs, for tests); rank 0
    returns (and writes to `out`) the rows."""
    import json

    import torch
    import torch.distributed as dist

    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank if local_rank is None else local_rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    rows = []
    try:
        for nbytes in sizes:
            iters = 20 if nbytes >= 1 << 24 else 50
            t = _time_allreduce(dist, torch, nbytes, warmup=5, iters=iters, device=device)
            algbw = nbytes / t / 1e9
            rows.append({"bytes": nbytes, "time_us": round(t * 1e6, 2), "algbw_gbps": round(algbw, 3),
                         "busbw_gbps": round(busbw(algbw, world), 3)})
    finally:
        dist.destroy_process_group()
    if rank == 0 and out:
        Path(out).write_text(json.dumps(rows))
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_sweep(gpus: int, sizes: list[int], workdir: Path, backend: str = "nccl") -> dict:
    """The sweep over this node's `gpus` GPUs through torch.distributed (one process per GPU)."""
    import json

    import torch.multiprocessing as mp

    if gpus < 2:
        return {"tool": NA, "why": f"{gpus} GPU(s): an all_reduce needs at least 2", "rows": []}
    out = workdir / "allreduce_rank0.json"
    init = f"tcp://127.0.0.1:{_free_port()}"
    mp.spawn(worker, args=(gpus, init, sizes, str(out), None, backend), nprocs=gpus, join=True)
    return {"tool": f"torch.distributed all_reduce ({backend})", "ranks": gpus, "rows": json.loads(out.read_text())}


def srun_sweep(sizes: list[int], out: Path) -> list[dict]:
    """One rank per GPU across nodes, started by `srun --ntasks-per-node=<gpus>`: rank, world and
    local GPU from Slurm, the rendezvous at MASTER_ADDR:MASTER_PORT (the first node of the job)."""
    env = os.environ
    init = f"tcp://{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '29511')}"
    return worker(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), init, sizes, str(out),
                  local_rank=int(env["SLURM_LOCALID"]))


def measure(gpus: int, sizes: list[int], workdir: Path, nccl_tests: Path | None = None) -> dict:
    """nccl-tests when its binary is given (built by build_nccl_tests), else torch.distributed."""
    if gpus >= 2 and nccl_tests is not None and Path(nccl_tests).is_file():
        rows = run_nccl_tests(Path(nccl_tests), gpus, begin=str(sizes[0]), end=str(sizes[-1]))
        return {"tool": f"nccl-tests {NCCL_TESTS_COMMIT} all_reduce_perf", "ranks": gpus, "rows": rows}
    return torch_sweep(gpus, sizes, workdir)
