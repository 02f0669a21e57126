"""The shards of a corpus, their split over download tasks, and the download of one task's share.

A corpus source is a URL pattern over ranges (SlimPajama: chunk 1..10 × shard 0..5999), a URL
list, a local folder, or a Hugging Face Hub repository (`hub:`, its file paths as a pattern
over ranges or a list; fetched with huggingface_hub through mlrepro.data.hub.hub_download, one
call per task for the task's missing files, the token read from the variable named by
`token_env`, never written). Every shard has a fixed position in that list; tasks take the
contiguous share [rank·n/world, (rank+1)·n/world) as the NeMo guide's download.py does, so a
Slurm array task only needs its RANK and WORLD_SIZE. Each file goes through
mlrepro.data.http.http_download (resumed from its .part, 429/5xx retried honouring Retry-After,
renamed into place only when complete), so a file that is there is complete and skipped.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mlrepro.data import checks, http
from mlrepro.data.hub import hub_download
from mlrepro.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class CorpusError(RuntimeError):
    """A corpus stage cannot go on; the message says what is wrong or missing."""


@dataclass(frozen=True)
class Shard:
    position: int
    source: str  # URL or local path
    name: str

    @property
    def is_local(self) -> bool:
        return "://" not in self.source

    @property
    def hub_path(self) -> str | None:
        """The file's path in its Hub repository (hub sources: hf://<repo>/<path>)."""
        return self.source.split("/", 4)[4] if self.source.startswith(HUB_SCHEME) else None


HUB_SCHEME = "hf://"


def _pattern_shards(pattern: str, ranges: dict, name_pattern: str, prefix: str = "") -> list[Shard]:
    keys = list(ranges)
    unknown = set(_PLACEHOLDER.findall(pattern)) - set(keys)
    if unknown:
        raise CorpusError(f"source: the pattern uses {', '.join(sorted(unknown))} but source.ranges does not give them")
    shards = []
    for i, values in enumerate(itertools.product(*(range(a, b + 1) for a, b in ranges.values()))):
        fields = dict(zip(keys, values))
        shards.append(Shard(i, prefix + pattern.format(**fields), name_pattern.format(**fields)))
    return shards


def expand(source: dict, root: Path | None = None) -> list[Shard]:
    """All shards of a corpus source, in their fixed order."""
    if "urls" in source:
        names = [source.get("name") or Path(urlsplit(u).path).name for u in source["urls"]]
        if len(set(names)) != len(names):
            raise CorpusError("source.urls: two URLs end in the same file name; give source.name")
        return [Shard(i, u, n) for i, (u, n) in enumerate(zip(source["urls"], names))]
    if "folder" in source:
        folder = Path(source["folder"]).expanduser()
        if root is not None and not folder.is_absolute():
            folder = root / folder
        if not folder.is_dir():
            raise CorpusError(f"source.folder {folder}: not a folder")
        files = sorted(p for p in folder.glob(source.get("glob", "*.jsonl*")) if p.is_file())
        return [Shard(i, str(p.resolve()), p.name) for i, p in enumerate(files)]
    if "hub" in source:
        prefix = f"{HUB_SCHEME}{source['hub']['repo']}/"
        if "paths" in source:
            shards = [Shard(i, prefix + p, Path(p).name) for i, p in enumerate(source["paths"])]
        else:
            shards = _pattern_shards(source["path"], source["ranges"], source.get("name") or Path(source["path"]).name, prefix)
    else:
        pattern = source["url"]
        shards = _pattern_shards(pattern, source["ranges"], source.get("name") or Path(urlsplit(pattern).path).name)
    if len({s.name for s in shards}) != len(shards):
        raise CorpusError("source.name: the pattern gives two shards the same file name; use every placeholder in it")
    return shards


def share(n: int, rank: int, world: int) -> range:
    """Positions of task `rank` of `world` (the NeMo guide's split_shards)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    return range(rank * n // world, (rank + 1) * n // world)


def groups(n: int, per_group: int) -> list[range]:
    """Positions of each concatenated chunk: consecutive runs of `per_group` shards."""
    return [range(g, min(g + per_group, n)) for g in range(0, n, per_group)]


def groups_by_bytes(sizes: list[int | None], limit: int) -> list[range]:
    """Positions of each chunk by size: consecutive shards whose sizes add up to at most `limit`
    bytes (a larger shard is a chunk alone); holes (None) stay where they are and add nothing.
    The same sizes always give the same chunks."""
    chunks: list[range] = []
    start, total = 0, 0
    for p, size in enumerate(sizes):
        size = size or 0
        if total and total + size > limit:
            chunks.append(range(start, p))
            start, total = p, 0
        total += size
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


def _is_not_found(exc: Exception) -> bool:
    # http_download reports the status only in its message.
    return "HTTP 404" in str(exc) or "HTTP 410" in str(exc)


def fetch_hub_shards(hub: dict, wanted: list[Shard], folder: Path, *, workers: int, token_env: str,
                     token_required: bool) -> None:
    """The `wanted` shards not yet in `folder`, in one huggingface_hub call (it resumes partial files);
    a path the repository does not have is simply not fetched (a hole, like HTTP 404)."""
    todo = [s for s in wanted if not (folder / s.name).exists()]
    if not todo:
        return
    staging = folder / ".hub"
    hub_download(hub["repo"], staging, repo_type=hub.get("repo_type", "dataset"), revision=hub.get("revision"),
                      allow_patterns=[s.hub_path for s in todo], token_env=token_env, token_required=token_required,
                      endpoint=hub.get("endpoint"), max_workers=workers)
    for s in todo:
        got = staging / s.hub_path
        if got.is_file():
            os.replace(got, folder / s.name)


def fetch_shard(shard: Shard, dest: Path, *, retries: int, token: str | None, expected: dict | None,
                progress=None) -> int | None:
    """Bring one shard to `dest`; its size, or None when the source does not have it (404)."""
    if shard.hub_path is not None:  # fetched by fetch_hub_shards
        if not dest.exists():
            return None
        problem = http.verify_file(dest, (expected or {}).get("size"), (expected or {}).get("sha256"))
        if problem:
            raise checks.DownloadError(f"{dest.name}: {problem}")
        return dest.stat().st_size
    if shard.is_local:
        if not Path(shard.source).is_file():
            return None
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".link")
            tmp.unlink(missing_ok=True)
            os.symlink(shard.source, tmp)
            os.replace(tmp, dest)
        return dest.stat().st_size
    try:
        http.http_download(shard.source, dest, retries=retries, token=token, progress=progress,
                           expected_size=(expected or {}).get("size"), sha256=(expected or {}).get("sha256"))
    except checks.DownloadError as exc:
        if _is_not_found(exc):
            return None
        raise
    return dest.stat().st_size


def download_share(shards: list[Shard], rank: int, world: int, folder: Path, report: Path, *,
                   workers: int = 8, retries: int = 5, token_env: str | None = None,
                   manifest: dict | None = None, already: callable | None = None, hub: dict | None = None,
                   meter=None) -> dict:
    """Download task `rank`'s share into `folder`; write and return its report.

    `already(shard)` says a shard is done in a later form (extracted, its .zst removed). `meter`
    (a util.progress.Meter) counts the bytes; its total is the share's shards at the mean size of
    those done so far (a manifest's sizes where it has them), so the ETA firms up as shards finish.
    """
    token = checks.require_token(token_env, purpose="download the corpus") if token_env and not hub else None
    mine = [shards[p] for p in share(len(shards), rank, world)]
    log.info("task %d of %d: %d shards (positions %s)", rank, world, len(mine),
             f"{mine[0].position}..{mine[-1].position}" if mine else "none")
    if hub:
        fetch_hub_shards(hub, [s for s in mine if not (already and already(s))], folder, workers=workers,
                         token_env=token_env or "HF_TOKEN", token_required=bool(token_env))

    todo = [s for s in mine if not (already is not None and already(s))]
    sizes = [m["size"] for m in (manifest or {}).values() if isinstance(m, dict) and m.get("size")]
    if meter is not None and sizes and len(sizes) >= len(todo):
        meter.estimate_total(sum(((manifest or {}).get(s.name) or {}).get("size") or 0 for s in todo))
    finished: list[int] = []

    def one(shard: Shard):
        if already is not None and already(shard):
            return shard, 0  # extracted and removed by an earlier run: present, its bytes no longer here
        size = fetch_shard(shard, folder / shard.name, retries=retries, token=token,
                           expected=(manifest or {}).get(shard.name), progress=meter.add if meter else None)
        if meter is not None and size and not sizes:
            finished.append(size)
            meter.estimate_total(sum(finished) / len(finished) * len(todo))
        return shard, size

    files, missing, errors = {}, [], []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, s) for s in mine]
        for fut in futures:
            try:
                shard, size = fut.result()
            except checks.DataError as exc:
                errors.append(str(exc))
                continue
            if size is None:
                missing.append(shard.name)
            else:
                files[shard.name] = size
    if errors:
        raise CorpusError(f"task {rank} of {world}: {len(errors)} shard(s) failed:\n  " + "\n  ".join(errors[:20]))
    result = {"rank": rank, "world": world, "files": files, "missing": missing}
    if meter is not None:
        meter.set_total(meter.done)  # the estimate counted the shards the server does not have
    atomic_write_json(report, result)
    log.info("task %d of %d: %d files, %d not on the server", rank, world, len(files), len(missing))
    return result


def verify(shards: list[Shard], reports: list[dict], out: Path, *, expected_files: int | None = None,
           min_files: int | None = None) -> dict:
    """Check the tasks' reports together against the corpus description; write the list of shards."""
    files: dict[str, int] = {}
    missing: list[str] = []
    for r in reports:
        files.update(r["files"])
        missing += r["missing"]
    unaccounted = [s.name for s in shards if s.name not in files and s.name not in missing]
    if unaccounted:
        raise CorpusError(f"{len(unaccounted)} shard(s) in no task's report, e.g. {', '.join(unaccounted[:5])}")
    if min_files is not None and len(files) < min_files:
        raise CorpusError(f"{len(files)} shards downloaded, at least {min_files} expected; not found on the server: "
                          f"{', '.join(sorted(missing)[:10])}{' ...' if len(missing) > 10 else ''}")
    if expected_files is None and min_files is None and missing:
        raise CorpusError(f"{len(missing)} shard(s) not found on the server (HTTP 404): "
                          f"{', '.join(sorted(missing)[:10])}{' ...' if len(missing) > 10 else ''}; "
                          f"if the source has holes, set expected.files or expected.min_files")
    if expected_files is not None and len(files) != expected_files:
        raise CorpusError(f"{len(files)} shards downloaded, expected {expected_files}; not found on the server: "
                          f"{', '.join(sorted(missing)[:10])}{' ...' if len(missing) > 10 else ''}")
    record = {"num_files": len(files), "num_bytes": sum(files.values()), "missing": sorted(missing),
              "shards": [{"position": s.position, "name": s.name, "size": files.get(s.name)} for s in shards]}
    atomic_write_json(out, record)
    log.info("download verified: %d files, %d bytes, %d absent from the source", len(files), record["num_bytes"],
             len(missing))
    return record
