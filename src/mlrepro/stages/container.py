"""The rules of workflow/rules/container.smk: the implementation fetched, its image built."""

from __future__ import annotations

import logging
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import kinds, paths
from mlrepro.container import image as containers
from mlrepro.container import prebuilt
from mlrepro.implementation.configs import list_configs
from mlrepro.implementation.fetch import fetch_implementation
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger("mlrepro.stages")


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0])), {}))
def implementation(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Fetch a git implementation at its pinned commit into resources/<benchmark>/implementation/."""
    bench = settings.benchmark(benchmark)
    git = bench.implementation_git
    dest = paths.implementation_dir(settings.root, benchmark)
    folder = fetch_implementation(git["url"], git["commit"], git["folder"], dest)
    atomic_write_json(out, {**git, "path": str(folder), "configs": [str(p) for p in list_configs(folder)]})


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0])), {}))
def container(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Build the implementation's image (or, with runtime none, record this machine's environment);
    a prebuilt image the system or benchmark names is checked and recorded instead, never built."""
    bench = settings.benchmark(benchmark)
    runtime = settings.system.container_runtime
    image = mlrepro_config.prebuilt_image(bench, settings.system)
    if image:
        use_prebuilt(image, runtime, settings.root, out)
        return
    folder = kinds.of(bench).implementation_folder(bench, settings.system)
    containers.build_container(
        {
            "runtime": "podman" if runtime == "enroot" else runtime,
            "context": str(folder),
            "dockerfile": str(folder / "Dockerfile"),
            "tag": f"mlrepro/{benchmark}:{folder.name.lower()}",
            # pyxis/enroot clusters run a squashfs image (or pull a pushed one); podman runs the image itself.
            "sqsh": (str(paths.image_sqsh(settings.root, benchmark))
                     if runtime == "enroot" and not settings.system.container_registry else None),
            "push": settings.system.container_registry,
        },
        out,
    )


def use_prebuilt(image: str, runtime: str, root: Path, out: Path) -> None:
    """container.json of a prebuilt image: checked to exist, with its digest and size; never built."""
    podman = containers.runtime_command("podman") if prebuilt.parse(image, root, runtime).kind == prebuilt.PODMAN else None
    record = prebuilt.describe(image, runtime, root=root, podman=podman, previous=paths.read_json_if_exists(out))
    log.info("using the prebuilt image %s (%s, digest %s, %s bytes); nothing is built", image, record["kind"],
             record.get("digest") or record.get("image_id"), f"{record['size']:,}" if record.get("size") else "?")
    atomic_write_json(out, record)


def current_image(settings: mlrepro_config.Settings, benchmark: str) -> None:
    """Before a seed starts: container.json made for another image than the system names now (the
    workflow's rerun trigger is mtime alone, so a changed name does not rerun the container stage).
    A prebuilt image is checked and recorded here; a build must be asked for."""
    out = paths.container_json(settings.root, benchmark)
    record = paths.read_json_if_exists(out) or {}
    image = mlrepro_config.prebuilt_image(settings.benchmark(benchmark), settings.system)
    runtime = settings.system.container_runtime
    if prebuilt.record_matches(record, image, runtime):
        return
    was = record.get("image") or record.get("tag") or f"runtime {record.get('runtime', 'none')}"
    if image:
        log.info("%s was made for %s; system %s names %s", out, was, settings.system.name, image)
        use_prebuilt(image, runtime, settings.root, out)
        return
    raise mlrepro_config.ConfigError(
        f"{out} was made for {was}, but system {settings.system.name} builds its image (runtime {runtime}): run the "
        f"container stage again first (snakemake ... --forcerun container)")
