"""What a stage fetched (paths, sizes, hashes), written atomically, and checked again before a seed uses it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Mapping, Sequence

from mlrepro.util.fsutil import atomic_write_json, file_manifest, sha256_file, xxh3_file
from mlrepro.data.checks import DataError

log = logging.getLogger(__name__)



# huggingface_hub keeps its resume and metadata files here inside local_dir.
_MANIFEST_SKIP_PREFIX = ".cache/huggingface/"
# Sources whose tools check what they resume: huggingface_hub (its metadata in
# .cache/huggingface) and rclone copy (size and time against the remote). A script
# has no such contract, so what an interrupted one left behind is not trusted.
_RESUMABLE_SOURCES = ("hub", "rclone", "user_path")


def resumable(sources: Sequence[Mapping]) -> bool:
    """Whether a stage's temporary folder from an interrupted attempt may be resumed."""
    return all(any(kind in source for kind in _RESUMABLE_SOURCES) for source in sources)


def drop_transfer_state(folder: str | os.PathLike) -> list[str]:
    """Remove what the download tools keep only while transferring (huggingface_hub's
    .cache/huggingface, rclone's *.partial files), so it never reaches the final folder."""
    folder = Path(folder)
    removed = []
    hub_cache = folder / ".cache" / "huggingface"
    if hub_cache.is_dir():
        shutil.rmtree(hub_cache)
        removed.append(".cache/huggingface/")
        with contextlib.suppress(OSError):
            (folder / ".cache").rmdir()
    for part in sorted(folder.rglob("*.partial")):
        if part.is_file() and not part.is_symlink():
            part.unlink()
            removed.append(part.relative_to(folder).as_posix())
    return removed


def write_manifest(root: str | os.PathLike, out_json: str | os.PathLike,
                   extra: Mapping | None = None, *, hash: bool = True,
                   final_root: str | os.PathLike | None = None) -> dict:
    """Write {root, files: [{path, size, xxh3_128, sha256?}], num_files, num_bytes, ...extra} atomically.

    Every file gets its size and XXH3-128 (read at disk speed, checked before every seed by
    `verify_manifest`); with `hash=False` (trees of terabytes) sha256 is left out.
    `final_root` is the folder `root` becomes once it is renamed into place (the
    manifest names that one, not the temporary folder it was written in).
    """
    root = Path(root)
    out_json = Path(out_json)
    if not root.is_dir():
        raise DataError(f"cannot write a manifest of {root}: it is not a folder")
    exclude = ("manifest.json", out_json.name, VERIFIED_STAMP, STAGE_RECORD)
    rows = [r for r in file_manifest(root, exclude=exclude, sha256=hash)
            if not r["path"].startswith(_MANIFEST_SKIP_PREFIX)]
    manifest = {
        "root": str(Path(final_root or root).resolve()),
        "hashed": hash,
        "num_files": len(rows),
        "num_bytes": sum(r["size"] for r in rows),
        "files": rows,
    }
    for k, v in (extra or {}).items():
        if k in manifest:
            raise ValueError(f"extra key {k!r} collides with a manifest field")
        manifest[k] = v
    atomic_write_json(out_json, manifest)
    return manifest


# The stage's own copy of its manifest, kept inside its folder: Snakemake deletes the manifest
# (the rule's output) before it runs the stage again, this copy it never sees.
STAGE_RECORD = ".stage-manifest.json"


def keep_record(manifest_json: str | os.PathLike) -> None:
    """Keep a copy of a stage's manifest as its record (same bytes, same mtime)."""
    manifest_json = Path(manifest_json)
    copy = manifest_json.parent / f".{STAGE_RECORD}.tmp"
    shutil.copy2(manifest_json, copy)
    os.replace(copy, manifest_json.parent / STAGE_RECORD)


def reuse_finished(folder: str | os.PathLike, out_json: str | os.PathLike, same: Mapping) -> bool:
    """Put back the manifest of a stage that finished (its record) when every key of `same` is what
    the record says and every file is still what it lists; True if so.

    A stage whose workflow was killed after it finished, or which the rerun of an incomplete job runs
    again, is verified, not downloaded again; the manifest keeps its old mtime, so nothing downstream
    looks newer than before.
    """
    folder, out_json = Path(folder), Path(out_json)
    record = folder / STAGE_RECORD
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in same.items()):
        return False
    copy = out_json.parent / f".{out_json.name}.tmp"
    shutil.copy2(record, copy)
    os.replace(copy, out_json)
    problems = verify_manifest(out_json)
    if problems:
        log.warning("%s: the finished stage's files changed, fetching again: %s", folder, "; ".join(problems[:3]))
        out_json.unlink()
        return False
    log.info("%s: finished and verified before; its manifest is put back, nothing is fetched", folder)
    return True


# What verify_manifest last found right: {path: [size, mtime_ns, ctime_ns, inode]} per manifest.
VERIFIED_STAMP = ".verified.json"


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def verify_manifest(manifest_json: str | os.PathLike) -> list[str]:
    """Check the files of a stage folder against its manifest.json; the problems, each naming its file.

    Sizes are checked always, content by the manifest's XXH3-128 (sha256 for manifests
    written before it had one). A file whose size, mtime, ctime and inode are those it had
    when last found right is not read again: replacing or writing a file changes its ctime,
    which no user-space call can set back, so 140 GB are hashed once, not before every seed.
    Files are looked for beside the manifest (its `root` may name the temporary folder the
    stage wrote into).
    """
    manifest_json = Path(manifest_json)
    folder = manifest_json.parent
    try:
        manifest = json.loads(manifest_json.read_text())
    except (OSError, ValueError) as exc:
        return [f"{manifest_json}: cannot be read ({exc})"]
    stamp_path = folder / VERIFIED_STAMP
    stamp = {}
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads(stamp_path.read_text())
        if recorded.get("manifest") == _stat_key(manifest_json.stat()):
            stamp = recorded.get("files", {})
    problems, verified = [], {}
    for row in manifest.get("files", []):
        path = folder / row["path"]
        try:
            st = path.stat()
        except OSError:
            problems.append(f"{path}: missing (the manifest lists {row['size']:,} bytes)")
            continue
        if st.st_size != row["size"]:
            problems.append(f"{path}: {st.st_size:,} bytes, the manifest says {row['size']:,}: it changed")
            continue
        key = _stat_key(st)
        if stamp.get(row["path"]) == key:
            verified[row["path"]] = key
            continue
        if "xxh3_128" in row:
            kind, expected, actual = "content (xxh3_128)", row["xxh3_128"], xxh3_file(path)
        elif "sha256" in row:
            kind, expected, actual = "content (sha256)", row["sha256"], sha256_file(path)
        else:
            verified[row["path"]] = key  # an old manifest of sizes only
            continue
        if actual != expected:
            problems.append(f"{path}: {kind} differs from the manifest: it changed")
        else:
            verified[row["path"]] = key
    with contextlib.suppress(OSError):
        atomic_write_json(stamp_path, {"manifest": _stat_key(manifest_json.stat()), "files": verified})
    return problems
