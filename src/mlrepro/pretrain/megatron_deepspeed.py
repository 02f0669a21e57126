"""Megatron-DeepSpeed (the Megatron-DeepSpeed guide's own stack): its pretrain_gpt.py argument lines, its
ds_config.json, the batch-size check between the two, and the source at the pinned commit with the
repository's patches applied.

The layout, iterations, wall time and run are megatron_plan's (one planner for every launcher, which renders
the dry run's line with this module); what differs
from Megatron-LM is the argument set: this fork has no --transformer-impl, --log-throughput or
overlap flags, ZeRO (the ds_config) replaces the distributed optimizer, and --no-pipeline-parallel runs
a PP1 layout as a plain module rather than DeepSpeed's one-stage pipeline engine. Without apex the
fusions are off (implementations/megatron_deepspeed/patches make the rest importable).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tarfile
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro.paths import SeedPaths
from mlrepro.implementation import fetch as implementation
from mlrepro.pretrain import megatron_launch
from mlrepro.util.fsutil import atomic_path

IMPLEMENTATION = Path("implementations/megatron_deepspeed")
PATCHES = IMPLEMENTATION / "patches"
# What pretrain_gpt.py imports of the repository: the megatron package and tools/ (arguments.py imports
# tools.retro.utils).
PACKED = ("megatron", "tools", "pretrain_gpt.py")
# Without apex: no fused masked softmax, bias-gelu, bias-dropout or gradient accumulation into fp32 grads.
APEX_FREE = ["--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
             "--no-gradient-accumulation-fusion"]
# Megatron-LM flags this fork does not have (argparse would refuse them) or that ZeRO replaces.
NOT_IN_FORK = {"--context-parallel-size": 1, "--use-distributed-optimizer": 0, "--log-throughput": 0,
               "--overlap-grad-reduce": 0, "--overlap-param-gather": 0, "--transformer-impl": 1,
               "--no-persist-layer-norm": 0, "--spec": 2, "--deterministic-mode": 0, "--ckpt-format": 1,
               "--exit-signal": 1}
TENSORBOARD = SeedPaths.TENSORBOARD  # the seed folder's subfolder the run's tfevents go to


class BatchMismatch(mlrepro_config.ConfigError):
    """The ds_config's batch sizes disagree with the launch line's; the message names the key."""


def _flag(args: list[str], name: str) -> int | None:
    return int(args[args.index(name) + 1]) if name in args else None


def check_batch(cfg: dict, args: list[str], dp: int, where: str) -> None:
    """DeepSpeed's rule, train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x DP,
    and the launch line's --global-batch-size / --micro-batch-size equal to them: DeepSpeed would stop
    the run at its start, after the job waited in the queue. BatchMismatch names the key and `where`."""
    gbs, mbs = _flag(args, "--global-batch-size"), _flag(args, "--micro-batch-size")
    tbs, micro = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
    ga = cfg.get("gradient_accumulation_steps")
    if None in (tbs, micro, ga):
        missing = [k for k, v in (("train_batch_size", tbs), ("train_micro_batch_size_per_gpu", micro),
                                  ("gradient_accumulation_steps", ga)) if v is None]
        raise BatchMismatch(f"{where}: ds_config has no {missing[0]}")
    if tbs != micro * ga * dp:
        raise BatchMismatch(f"{where}: ds_config train_batch_size {tbs} != train_micro_batch_size_per_gpu {micro} "
                            f"x gradient_accumulation_steps {ga} x DP{dp} (= {micro * ga * dp})")
    if gbs is not None and tbs != gbs:
        raise BatchMismatch(f"{where}: ds_config train_batch_size {tbs} != the launch line's --global-batch-size {gbs}")
    if mbs is not None and micro != mbs:
        raise BatchMismatch(f"{where}: ds_config train_micro_batch_size_per_gpu {micro} != the launch line's "
                            f"--micro-batch-size {mbs}")


def _without_fork_unknowns(args: list[str]) -> list[str]:
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a in NOT_IN_FORK:
            skip = NOT_IN_FORK[a]
        else:
            out.append(a)
    return out


def pretrain_args(run: megatron_launch.Run, *, zero_stage: int, ds_config_path: str,
                  tensorboard_dir: str = "", data_cache: str = "") -> list[str]:
    """Every pretrain_gpt.py flag of a Megatron-DeepSpeed run: Megatron-LM's (the same model, layout, data,
    schedule and logging) less what the fork lacks, then the apex-free flags and DeepSpeed's."""
    args = _without_fork_unknowns(megatron_launch.pretrain_args(
        megatron_launch.Run(**{**run.__dict__, "local_impl": False, "sdpa": False, "deterministic": False})))
    if run.save:  # the fork's handler catches SIGTERM only; the chain stops it by its own clock
        args = [a for a in args if a != "--exit-signal-handler"]
    args += APEX_FREE
    if run.layout.pp == 1:  # a plain module, not DeepSpeed's one-stage pipeline engine (what ZeRO-2/3 need)
        args.append("--no-pipeline-parallel")
    if run.sdpa:  # the fork's flash-attention path, on torch's SDPA (patch 0011) where flash-attn is absent
        args.append("--use-flash-attn-v2")
    if tensorboard_dir:
        args += ["--tensorboard-dir", tensorboard_dir, "--log-timers-to-tensorboard"]
    if data_cache:  # the dataset's index cache, where the corpus folder is read-only
        args += ["--data-cache-path", data_cache]
    return args + ["--deepspeed", "--deepspeed_config", ds_config_path, "--zero-stage", str(zero_stage)]


def seed_args(run: megatron_launch.Run, cfg: dict, *, zero_stage: int, where: str,
              ds_config_path: str = "ds_config.json", tensorboard_dir: str = TENSORBOARD) -> list[str]:
    """A seed's pretrain_gpt.py flags: megatron_plan.seed_run's run (the corpus stages' blend, the
    pre-tokenized vocabulary, the schedule) in this fork's words, its ds_config `cfg` checked against them."""
    args = pretrain_args(run, zero_stage=zero_stage, ds_config_path=ds_config_path, tensorboard_dir=tensorboard_dir)
    check_batch(cfg, args, run.layout.dp, where)
    return args


def launch_line(args: list[str], scheduler: str, gpus: int, gpus_per_node: int, image: str) -> str:
    """The line a seed runs: srun under Slurm, torchrun on one machine."""
    if scheduler == "slurm":
        return srun_line(args, gpus, gpus_per_node, image, "${DATADIR}:/data:ro,${LOGDIR}:/results:rw")
    return torchrun_line(args, gpus)


def torchrun_line(args: list[str], nproc: int) -> str:
    """One machine: torchrun starts the ranks (deepspeed.init_distributed reads its environment)."""
    return shlex.join(["torchrun", "--standalone", f"--nproc-per-node={nproc}", "pretrain_gpt.py", *args])


def deepspeed_line(args: list[str], nodes: int, gpus_per_node: int) -> str:
    """DeepSpeed's own launcher, as the guide runs it (shown by the dry run for review)."""
    return shlex.join(["deepspeed", f"--num_nodes={nodes}", f"--num_gpus={gpus_per_node}", "pretrain_gpt.py", *args])


def srun_line(args: list[str], gpus: int, gpus_per_node: int, image: str, mounts: str,
              workdir: str = "/workspace/megatron-deepspeed") -> str:
    """Slurm: one task per GPU in a pyxis container, as the Megatron-LM kind launches."""
    nodes = max(1, gpus // gpus_per_node)
    return shlex.join(["srun", "--mpi=pmix", f"--nodes={nodes}", f"--ntasks-per-node={min(gpus, gpus_per_node)}",
                       f"--container-image={image}", f"--container-mounts={mounts}",
                       f"--container-workdir={workdir}", "--no-container-mount-home",
                       "python", f"{workdir}/pretrain_gpt.py", *args])


def series(root: Path) -> list[Path]:
    """The patches in the order patches/series lists them."""
    folder = Path(root) / PATCHES
    names = [x.strip() for x in (folder / "series").read_text().splitlines() if x.strip() and not x.startswith("#")]
    return [folder / n for n in names]


def reasons(root: Path) -> dict[str, str]:
    """Each patch's one-line reason (its `Reason:` first line)."""
    return {p.name: p.read_text().splitlines()[0].removeprefix("Reason:").strip() for p in series(root)}


def apply_patches(root: Path, checkout: Path) -> list[str]:
    """The series applied to `checkout` (all checked first, so a patch that does not apply changes nothing)."""
    patches = series(root)
    for p in patches:
        done = subprocess.run(["git", "apply", "--check", str(p.resolve())], cwd=checkout, capture_output=True, text=True)
        if done.returncode:
            raise implementation.FetchError(f"{p} does not apply to {checkout}: {done.stderr.strip()}")
        subprocess.run(["git", "apply", str(p.resolve())], cwd=checkout, check=True, capture_output=True)
    return [p.name for p in patches]


def fetch(root: Path, url: str, commit: str, dest: Path) -> Path:
    """Megatron-DeepSpeed at `commit` (verified) in `dest`, patched; mlrepro_patches.json records which."""
    dest = Path(dest)
    implementation.fetch_implementation(url, commit, None, dest)
    marker = dest / "mlrepro_patches.json"
    if not marker.is_file():
        applied = apply_patches(root, dest)
        marker.write_text(json.dumps({"commit": commit, "patches": applied}) + "\n")
    if not (dest / "pretrain_gpt.py").is_file():
        raise implementation.FetchError(f"{url} at {commit} has no pretrain_gpt.py")
    return dest


def pack(checkout: Path, out: Path) -> Path:
    """A .tar.gz of what pretrain_gpt.py imports (what a machine without network is given)."""
    with atomic_path(Path(out)) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for name in (*PACKED, "mlrepro_patches.json"):
            if (Path(checkout) / name).exists():
                tar.add(Path(checkout) / name, arcname=name,
                        filter=lambda info: None if "__pycache__" in info.name else info)
    return Path(out)
