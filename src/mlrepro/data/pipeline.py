"""A data stage end to end: fill resources/<benchmark>/<stage>/ from the benchmark's sources, verify, write the manifest."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.data import checks, hub, manifest, mounts, scripts
from mlrepro.util import progress
from mlrepro.util.fsutil import atomic_dir
from mlrepro.util.proc import run_logged

log = logging.getLogger(__name__)


# Where a source's files go inside the container, when the script runs in one.
CONTAINER_OUT = "/mlrepro/out"


def fill_stage(settings: mlrepro_config.Settings, benchmark: str, stage: str, out: Path, log_path: Path,
               implementation_folder: Callable[[], Path]) -> None:
    """Fill resources/<benchmark>/<stage>/ from the benchmark's sources (or record the user's folder
    for a user_path source), verify it, write its manifest. `implementation_folder()` gives the folder
    whose scripts and expected-mounts.csv the stage uses (asked after the checks that need no folder)."""

    bench = settings.benchmark(benchmark)
    spec = getattr(bench, stage)
    if spec is None:
        raise mlrepro_config.ConfigError(f"{bench.source}: {stage}: not configured")
    folder = out.resolve().parent
    if manifest.reuse_finished(folder, out, {"benchmark": benchmark, "stage": stage, "sources": spec["sources"]}):
        return
    # Everything that can fail without downloading fails first.
    # A script in a container gets the token by name only (`--env HF_TOKEN`): its value stays
    # in the environment, off every command line and, redacted, out of every log.
    token_env = {TOKEN_ENV: checks.require_token(TOKEN_ENV, purpose=f"the {benchmark} {stage}")} \
        if spec["needs_token"] else {}
    impl = implementation_folder()
    mounts_csv = impl / "expected-mounts.csv"
    expected = mounts.read_expected_mounts(mounts_csv) if mounts_csv.is_file() else []
    # Absolute: the implementation's scripts run from its own folder (or in a container).
    folder = out.resolve().parent
    needed, why = space_needed(settings.root, bench, stage)
    checks.check_free_space(folder.parent, needed, why=why)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    record: dict = {"benchmark": benchmark, "stage": stage, "sources": spec["sources"]}
    image = _stage_image(settings, benchmark)

    # What an interrupted attempt left is resumed only where the tools check it (manifest.resumable).
    with atomic_dir(folder, resume=manifest.resumable(spec["sources"])) as partial:
        for source in spec["sources"]:
            if "user_path" in source:
                where = _user_folder(source)
                record["location"] = str(where)
                checked = where / source["into"] if source["into"] else where
            else:
                checked = where = partial / source["into"] if source["into"] else partial
                # The bytes arriving in the folder, against expected-mounts.csv's sizes where it has them:
                # the script or tool that downloads says nothing mlrepro can read.
                total = sum(e.num_bytes for e in expected if e.key == source.get("expected_mounts")) or None
                with progress.watch_folder(f"{benchmark} {stage}", where, paths.progress_file(log_path), total=total):
                    _fetch_source(source, where, spec, image, impl, log_path, stage, {**bench.env, **token_env})
            if source.get("expected_mounts"):
                _check_mounts(checked, source["expected_mounts"], expected, mounts_csv, stage)
        for name in manifest.drop_transfer_state(partial):
            log.info("%s: removed transfer leftover %s", stage, name)
        total = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
        # Hashing a 140 GB checkpoint would take longer than downloading it; sizes are checked.
        manifest.write_manifest(partial, partial / out.name, extra=record, hash=total < 2**30, final_root=folder)
        manifest.keep_record(partial / out.name)


def _fetch_source(source: dict, where: Path, spec: dict, image: str | None, impl: Path, log_path: Path, stage: str,
                  env: dict) -> None:
    """Bring one source's files into `where`: the implementation's script, a Hub repository or rclone."""
    where.mkdir(parents=True, exist_ok=True)
    if "script" in source:
        _run_script(source, impl, where, image, log_path, env)
    elif "hub" in source:
        repo = source["hub"]
        hub.hub_download(repo["repo_id"], where, repo_type=repo["repo_type"], revision=repo.get("revision"),
                         allow_patterns=repo.get("allow_patterns"), token_required=spec["needs_token"])
    else:
        run_logged(["rclone", "copy", source["rclone"], str(where)], env={}, log_path=log_path, error=checks.DataError)
    if source.get("cleanup"):
        for line in scripts.apply_cleanup(where, source["cleanup"]):
            log.info("%s cleanup: %s", stage, line)


def _check_mounts(folder: Path, key: str, expected: list, mounts_csv: Path, stage: str) -> None:
    """`folder` against the rows of expected-mounts.csv under `key`."""
    entries = [e for e in expected if e.key == key]
    if not entries:
        raise checks.DataError(f"{mounts_csv} has no rows for {key}")
    problems = mounts.verify_mounts(folder, entries)
    if problems:
        raise checks.DataError(f"{stage} does not match {mounts_csv.name} ({key}):\n  " + "\n  ".join(problems[:20]))


TOKEN_ENV = "HF_TOKEN"
GB = 10**9


def _bytes_under(*folders: Path) -> int:
    return sum(f.stat().st_size for folder in folders if folder.is_dir() for f in folder.rglob("*") if f.is_file())


def space_needed(root: Path, bench: mlrepro_config.Benchmark, stage: str) -> tuple[int, str]:
    """Free bytes the stage needs before it starts, and why (NVIDIA's figures, in the benchmark's config).

    The benchmark's min_free_gb covers the dataset and the checkpoint together; the stage's own
    covers itself. What resources/<benchmark>/ already holds (a finished stage, a partial download)
    counts as had, and a stage used in place (user_path sources only) writes nothing here.
    """
    def in_place(spec) -> bool:
        return all("user_path" in source for source in spec["sources"])

    spec = getattr(bench, stage)
    if in_place(spec):
        return 0, f"{stage} is used in place"
    folders = {name: paths.stage_folder(root, bench.name, name) for name in paths.STAGE_FOLDERS}
    held = {name: _bytes_under(f, f.parent / f".{f.name}.partial") for name, f in folders.items()}
    others_in_place = sum(getattr(bench, name)["min_free_gb"] for name in folders
                          if getattr(bench, name) and in_place(getattr(bench, name)))
    total = bench.min_free_gb * GB - sum(held.values()) - others_in_place * GB
    own = spec["min_free_gb"] * GB - held[stage]
    why = [f"{bench.name} needs {bench.min_free_gb:g} GB for its dataset and checkpoint together"
           + (f", {others_in_place:g} GB of it used in place" if others_in_place else "")
           + f"; resources/{bench.name}/ holds {sum(held.values()) / GB:,.1f} GB of it"] if bench.min_free_gb else []
    if spec["min_free_gb"]:
        why.append(f"the {stage} alone needs {spec['min_free_gb']:g} GB, {held[stage] / GB:,.1f} GB of it there")
    return max(0, int(total), int(own)), "; ".join(why)


def _user_folder(source: dict) -> Path:
    name = source["user_path"]
    value = os.environ.get(name)
    if not value:
        raise checks.DataError(f"{name} is not set: export {name}=<folder that holds {source['into'] or 'the files'}>")
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise checks.DataError(f"{name}={value} is not a folder")
    return folder


def _stage_image(settings, benchmark: str) -> str | None:
    """The image download scripts run in: the .sqsh (enroot), the podman tag, or None (host)."""
    if settings.system.container_runtime == "none":
        return None
    return paths.container_image(paths.read_container(settings.root, benchmark), pushed=False)


def _run_script(source: dict, impl: Path, where: Path, image: str | None, log_path: Path, env: dict) -> None:
    if image is None:
        args = [a.replace("{out}", str(where)) for a in source["args"]]
        scripts.run_download_script(impl / source["script"], args, env={**os.environ, **env}, log_path=log_path, workdir=impl)
    else:
        # In the image the implementation is its working directory, as in NVIDIA's READMEs.
        args = [a.replace("{out}", CONTAINER_OUT) for a in source["args"]]
        scripts.run_download_script(source["script"], args, env=env, log_path=log_path, container=image,
                                 mounts={str(where): CONTAINER_OUT})
