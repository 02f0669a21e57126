"""The container stage: build an implementation's image and hand it to the cluster.

On a Slurm cluster with pyxis the job runs an enroot squashfs image (.sqsh); on
other clusters it pulls from a registry. We build with podman (or docker), then
either export an enroot-style .sqsh or push. The stage's JSON target records the
image id and digest plus a digest of the build context, so the image is rebuilt
only when the context changes.

For `runtime: none` (the miniature benchmark on a laptop) there is no image; the
target records the Python environment instead, so a run can still be traced to
the software it ran on.

podman settings come from the environment, so CI or a shared machine can keep
the image store out of /var/lib/containers without editing global files:
MLREPRO_PODMAN_STORAGE_DRIVER (e.g. vfs where overlay mounts are not allowed),
MLREPRO_PODMAN_ROOT and MLREPRO_PODMAN_RUNROOT (store and state folders), and
MLREPRO_PODMAN_TMPDIR (libpod's own state, /run/libpod by default: stores that
share it are not independent, and a `podman system reset` of one breaks builds in
the others).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from mlrepro.container.context import ContainerError, context_digest
from mlrepro.util.fsutil import atomic_write_json, sha256_file
from mlrepro.paths import read_json_if_exists
from mlrepro.util.proc import run

log = logging.getLogger(__name__)

CONTEXT_LABEL = "org.mlrepro.context-digest"
RUNTIMES = ("podman", "docker", "none")
# enroot's default mksquashfs options; ENROOT_SQUASH_OPTIONS overrides them, as for enroot itself.
DEFAULT_SQUASH_OPTIONS = "-comp lzo -noD"
_PACKAGES = ("torch", "transformers", "peft", "mlperf-logging", "snakemake", "snakemake-executor-plugin-slurm",
             "submitit", "safetensors", "huggingface_hub", "numpy")


# ---------------------------------------------------------------------------
# runtime: none


def environment_manifest() -> dict:
    """The software this process runs on: Python, platform, key package versions, CUDA, host."""
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    cuda: dict[str, Any] = {"available": False, "device_count": 0, "version": None}
    try:
        import torch

        cuda = {
            "available": bool(torch.cuda.is_available()),
            "device_count": int(torch.cuda.device_count()),
            "version": torch.version.cuda,
        }
    except ImportError:
        pass
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "cuda": cuda,
    }


# ---------------------------------------------------------------------------
# podman / docker


# podman's global options and the variables that set them (the module's docstring says why each).
PODMAN_SETTINGS = (("--storage-driver", "MLREPRO_PODMAN_STORAGE_DRIVER"), ("--root", "MLREPRO_PODMAN_ROOT"),
                   ("--runroot", "MLREPRO_PODMAN_RUNROOT"), ("--tmpdir", "MLREPRO_PODMAN_TMPDIR"))


def runtime_command(runtime: str = "podman") -> list[str]:
    """The runtime's command with the global options this environment asks for."""
    if runtime not in ("podman", "docker"):
        raise ContainerError(f"unknown container runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    exe = shutil.which(runtime)
    if exe is None:
        hint = "apt-get install -y podman" if runtime == "podman" else "install docker"
        raise ContainerError(f"{runtime} is not installed on this machine ({hint})")
    cmd = [exe]
    if runtime == "podman":
        for option, variable in PODMAN_SETTINGS:
            if os.environ.get(variable):
                cmd += [option, os.environ[variable]]
    return cmd


def _run(cmd: Sequence[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    """A container runtime command (util.proc.run); failures raise ContainerError naming `what`."""
    log.debug("running %s", shlex.join(cmd))
    return run(cmd, error=ContainerError, what=what, detail_chars=4000, **kwargs)


def inspect_image(image: str, runtime: str = "podman") -> dict | None:
    """The runtime's description of a local image, or None when it has no such image."""
    return _inspect(image, runtime)[0]


def _inspect(image: str, runtime: str) -> tuple[dict | None, str]:
    """inspect_image, and what the runtime said when it has no description to give."""
    proc = subprocess.run([*runtime_command(runtime), "image", "inspect", image], capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip()
    data = json.loads(proc.stdout or "[]")
    return (data[0], "") if data else (None, "no image in its answer")


def _image_record(info: dict, runtime: str, tag: str) -> dict:
    config = info.get("Config") or {}
    labels = config.get("Labels") or info.get("Labels") or {}
    return {
        "runtime": runtime,
        "tag": tag,
        "image_id": "sha256:" + info["Id"].removeprefix("sha256:"),
        "digest": info.get("Digest") or None,
        "repo_digests": info.get("RepoDigests") or [],
        "created": info.get("Created"),
        "size": info.get("Size"),
        "context_digest": labels.get(CONTEXT_LABEL),
    }


def build_image(
    context_dir: str | os.PathLike,
    dockerfile: str | os.PathLike | None,
    tag: str,
    runtime: str = "podman",
    build_args: Mapping[str, str] | None = None,
) -> dict:
    """Build `dockerfile` (default: context/Dockerfile) as `tag`; return its id and digest.

    The image is labelled with the context digest so that a later build can tell
    whether an image under that tag still matches the context.
    """
    context = Path(context_dir)
    df = Path(dockerfile) if dockerfile else context / "Dockerfile"
    if not df.is_file():
        raise ContainerError(f"Dockerfile not found: {df}")
    digest = context_digest(context, df)
    cmd = [*runtime_command(runtime), "build", "-f", str(df), "-t", tag, "--label", f"{CONTEXT_LABEL}={digest}"]
    for key, value in (build_args or {}).items():
        cmd += ["--build-arg", f"{key}={value}"]
    cmd.append(str(context))
    _run(cmd, f"building {tag} with {runtime}")
    info, said = _inspect(tag, runtime)
    if info is None:
        raise ContainerError(f"{runtime} built {tag} but cannot inspect it afterwards: {said[-2000:]}")
    return _image_record(info, runtime, tag)


def _write_enroot_config(rootfs: Path, config: Mapping[str, Any]) -> None:
    """The files enroot's import writes so that pyxis starts the image like docker would.

    /etc/environment holds the image's Env, /etc/fstab its volumes as bind mounts,
    /etc/rc changes into WorkingDir, sources /etc/rc.local and execs the entrypoint
    with the command (or the arguments it is given), labels kept as comments.
    """
    etc = rootfs / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    env = config.get("Env") or []
    (etc / "environment").write_text("".join(f"{item}\n" for item in env))
    volumes = sorted((config.get("Volumes") or {}).keys())
    (etc / "fstab").write_text(
        "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in volumes)
    )
    workdir = config.get("WorkingDir") or "/"
    (rootfs / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    entrypoint = [shlex.quote(a) for a in (config.get("Entrypoint") or [])]
    cmd = [shlex.quote(a) for a in (config.get("Cmd") or [])]
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    labels = config.get("Labels") or {}
    lines = [f"# {key} {value}" for key, value in sorted(labels.items())]
    if lines:
        lines.append("")
    quoted_workdir = shlex.quote(workdir)
    lines += [
        f"mkdir -p {quoted_workdir} 2> /dev/null",
        f"cd {quoted_workdir} && unset OLDPWD || exit 1",
        "",
        "if [ -s /etc/rc.local ]; then",
        "    . /etc/rc.local",
        "fi",
        "",
        'if [ $# -gt 0 ]; then',
        "    exec " + " ".join(entrypoint + ['"$@"']),
        "else",
        "    exec " + " ".join(entrypoint + cmd),
        "fi",
        "",
    ]
    (etc / "rc").write_text("\n".join(lines))
    (etc / "rc.local").write_text("# Sourced by /etc/rc before the container's command; empty by default.\n")


def export_sqsh(image: str, out_path: str | os.PathLike, runtime: str = "podman") -> dict:
    """Write `image` as an enroot squashfs image at `out_path`; return its path, sha256 and size.

    `enroot import podman://IMAGE` (or dockerd://) is used where enroot is installed.
    Otherwise the same layout is produced directly: a container is created (never
    started), its filesystem exported and unpacked, enroot's /etc/rc, /etc/environment
    and /etc/fstab written from the image config, and the tree squashed with
    `mksquashfs -all-root` and ENROOT_SQUASH_OPTIONS (enroot's default: -comp lzo -noD).
    The file appears at `out_path` only when complete.
    """
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    info = inspect_image(image, runtime)
    if info is None:
        raise ContainerError(f"{runtime} has no image {image!r} to export")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staged = work / out.name
    try:
        enroot = shutil.which("enroot")
        if enroot:
            scheme = "podman" if runtime == "podman" else "dockerd"
            _run([enroot, "import", "--output", str(staged), f"{scheme}://{image}"], f"enroot import of {image}")
            method = "enroot import"
        else:
            _squash_export(image, info, work, staged, runtime)
            method = "export + mksquashfs"
        os.replace(staged, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": str(out), "sha256": sha256_file(out), "size": out.stat().st_size, "method": method}


def _squash_export(image: str, info: dict, work: Path, staged: Path, runtime: str) -> None:
    mksquashfs = shutil.which("mksquashfs")
    if mksquashfs is None:
        raise ContainerError("mksquashfs is not installed (apt-get install -y squashfs-tools); enroot is absent too")
    tar = shutil.which("tar")
    if tar is None:
        raise ContainerError("tar is not installed")
    base = runtime_command(runtime)
    name = f"mlrepro-export-{os.getpid()}-{work.name.rsplit('.', 1)[-1]}"
    # A placeholder command lets `create` accept images without CMD (FROM scratch);
    # the container is only exported, never started.
    _run([*base, "create", "--name", name, image, "/bin/sh"], f"creating a container from {image}")
    try:
        tarball = work / "rootfs.tar"
        _run([*base, "export", "-o", str(tarball), name], f"exporting {image}")
    finally:
        subprocess.run([*base, "rm", "-f", name], capture_output=True)
    rootfs = work / "rootfs"
    rootfs.mkdir()
    _run([tar, "-C", str(rootfs), "--warning=no-timestamp", "--anchored", "--exclude=dev/*",
          "--exclude=./dev/*", "--exclude=.dockerenv", "--no-same-owner", "-xf", str(tarball)],
         f"unpacking {image}")
    tarball.unlink()
    _write_enroot_config(rootfs, info.get("Config") or {})
    options = shlex.split(os.environ.get("ENROOT_SQUASH_OPTIONS", DEFAULT_SQUASH_OPTIONS))
    cmd = [mksquashfs, str(rootfs), str(staged), "-all-root", "-no-progress", "-quiet", *options]
    if os.environ.get("SOURCE_DATE_EPOCH"):
        epoch = os.environ["SOURCE_DATE_EPOCH"]
        cmd += ["-mkfs-time", epoch, "-all-time", epoch]
    _run(cmd, f"squashing {image}")


def push(image: str, registry_ref: str, runtime: str = "podman") -> dict:
    """Push `image` to `registry_ref` (e.g. registry.example.org/team/llama2:v5.0); return the pushed digest.

    With podman, `registry_ref` may also be any containers-transports destination
    (oci-archive:, dir:, docker://...). Credentials are the runtime's own (podman login).
    """
    base = runtime_command(runtime)
    if runtime == "podman":
        with tempfile.TemporaryDirectory(prefix="mlrepro-push-") as tmp:
            digest_file = Path(tmp) / "digest"
            _run([*base, "push", "--digestfile", str(digest_file), image, registry_ref],
                 f"pushing {image} to {registry_ref}")
            digest = digest_file.read_text().strip() if digest_file.exists() else None
    else:
        if image != registry_ref:
            _run([*base, "tag", image, registry_ref], f"tagging {image} as {registry_ref}")
        proc = _run([*base, "push", registry_ref], f"pushing {registry_ref}")
        match = re.search(r"digest: (sha256:[0-9a-f]{64})", proc.stdout)
        digest = match.group(1) if match else None
    return {"ref": registry_ref, "digest": digest}


# ---------------------------------------------------------------------------
# the stage


def _setting_or_default(spec: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """spec[key], or `default` when the key is absent, None or empty."""
    value = spec.get(key, default)
    return default if value in (None, "") else value


def build_container(spec: Mapping[str, Any], out_json: str | os.PathLike) -> dict:
    """Run the container stage described by `spec` and write its record to `out_json` atomically.

    spec keys: runtime (podman | docker | none), context (build folder), dockerfile
    (default context/Dockerfile), tag, build_args (mapping), sqsh (output path of an
    enroot image, optional), push (registry reference, optional).

    Nothing is rebuilt when the image under `tag` exists and its label holds the context's
    digest. When that image is the one an earlier `out_json` recorded, its .sqsh (size still
    matching) and its pushed copy are reused.
    """
    runtime = _setting_or_default(spec, "runtime", "podman")
    if runtime not in RUNTIMES:
        raise ContainerError(f"unknown container runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    if runtime == "none":
        record = {"runtime": "none", "environment": environment_manifest()}
        atomic_write_json(out_json, record)
        return record

    context = _setting_or_default(spec, "context")
    tag = _setting_or_default(spec, "tag")
    if not context or not tag:
        raise ContainerError("a container spec needs `context` (the build folder) and `tag` (the image name)")
    context = Path(context)
    dockerfile = Path(_setting_or_default(spec, "dockerfile", context / "Dockerfile"))
    digest = context_digest(context, dockerfile)

    out_path = Path(out_json)
    previous = read_json_if_exists(out_path) or {}

    info = inspect_image(tag, runtime)
    image = None
    if info is not None:
        current = _image_record(info, runtime, tag)
        if current["context_digest"] == digest:
            image = current
            log.info("image %s already matches the build context; not rebuilding", tag)
    if image is None:
        image = build_image(context, dockerfile, tag, runtime, _setting_or_default(spec, "build_args", {}))
    rebuilt = previous.get("image_id") != image["image_id"]

    record = {**image, "context": str(context), "dockerfile": str(dockerfile), "context_digest": digest}
    sqsh = _setting_or_default(spec, "sqsh")
    if sqsh:
        sqsh_path = Path(sqsh)
        old = previous.get("sqsh") or {}
        if (not rebuilt and old.get("path") == str(sqsh_path) and sqsh_path.is_file()
                and sqsh_path.stat().st_size == old.get("size")):
            record["sqsh"] = old
        else:
            record["sqsh"] = export_sqsh(tag, sqsh_path, runtime)
    ref = _setting_or_default(spec, "push")
    if ref:
        old = previous.get("push") or {}
        if not rebuilt and old.get("ref") == ref and old.get("digest"):
            record["push"] = old
        else:
            record["push"] = push(tag, ref, runtime)
    atomic_write_json(out_path, record)
    return record
