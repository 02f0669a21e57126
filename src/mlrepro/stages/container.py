"""The rules of workflow/rules/container.smk: the implementation fetched, its image built."""

from __future__ import annotations

from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import kinds, paths
from mlrepro.stages.process import rule
from mlrepro.util.fsutil import atomic_write_json


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0])), {}))
def implementation(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Fetch a git implementation at its pinned commit into resources/<benchmark>/implementation/."""
    from mlrepro.implementation.configs import list_configs
    from mlrepro.implementation.fetch import fetch_implementation

    bench = settings.benchmark(benchmark)
    git = bench.implementation_git
    dest = paths.implementation_dir(settings.root, benchmark)
    folder = fetch_implementation(git["url"], git["commit"], git["folder"], dest)
    atomic_write_json(out, {**git, "path": str(folder), "configs": [str(p) for p in list_configs(folder)]})


@rule(lambda smk, s: ((s, smk.wildcards.benchmark, Path(smk.output[0])), {}))
def container(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Build the implementation's image (or, with runtime none, record this machine's environment)."""
    from mlrepro.container import image as containers

    bench = settings.benchmark(benchmark)
    folder = kinds.of(bench).implementation_folder(bench, settings.system)
    runtime = settings.system.container_runtime
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
