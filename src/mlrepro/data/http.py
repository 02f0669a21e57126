"""Getting a benchmark's dataset and checkpoint onto disk, and proving they are right.

The pieces, in the order a data stage uses them:

- `require_token` / `check_free_space`: fail before anything is fetched when the
  source needs a token that is not set, or the filesystem cannot hold the data.
- `http_download`: one file over HTTP(S), resumable (also across restarts),
  retried on 429/5xx/dropped connections, verified by size and sha256, renamed
  into place only when complete.
- `hub_download`: a Hugging Face Hub repository through huggingface_hub.
- `run_download_script`: an implementation's own scripts/download_*.py, run on
  the host or inside its container, with secrets kept out of its log.
- `read_expected_mounts` / `verify_mounts`: NVIDIA's expected-mounts.csv, checked
  against what is on disk (files present, file counts, byte totals).
- `write_manifest`: what was fetched (paths, sizes, sha256), written atomically.
- `LLAMA2_70B_LORA_DATA`, `LLAMA31_405B_*`: the documented sources of each
  benchmark's data as plain data, for config and rules.

Secrets: a token reaches the server only in an `Authorization` header or a
child's environment. Every message this module raises or logs, and every log it
writes, has the token value replaced by `***`.
"""

from __future__ import annotations

import contextlib
import csv
import email.utils
import http.client
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from mlrepro.util.fsutil import atomic_write_json, file_manifest, sha256_file, xxh3_file
from mlrepro.util.secrets import redact, redactor, secret_values

log = logging.getLogger(__name__)

GIB = 1024**3


class DataError(RuntimeError):
    """A data or checkpoint step cannot go on; the message says why and what to do."""


class MissingTokenError(DataError):
    pass


class DownloadError(DataError):
    pass


# ---------------------------------------------------------------------------
# secrets (one definition, in mlrepro.util.secrets)
# ---------------------------------------------------------------------------

def _safe_url(url: str) -> str:
    """The URL without query string or user info: signed URLs carry credentials there."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def require_token(env: str = "HF_TOKEN", *, purpose: str | None = None,
                  environ: Mapping[str, str] | None = None) -> str:
    """The token in environment variable `env`; a clear error if it is unset or empty.

    Call it before any download starts, so a missing token costs nothing.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(env, "").strip()
    if not value:
        why = f" to {purpose}" if purpose else ""
        raise MissingTokenError(
            f"environment variable {env} is not set, and a token is needed{why}. "
            f"Export {env}=<your token> (for Hugging Face: https://huggingface.co/settings/tokens, "
            f"with access granted to the gated repository) and run again. "
            f"The token is passed only through the environment; it is never written to a log or file."
        )
    return value


# ---------------------------------------------------------------------------
# free space
# ---------------------------------------------------------------------------

def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_free_space(path: str | os.PathLike, needed_bytes: int, *, why: str = "") -> int:
    """Raise DataError unless the filesystem holding `path` has `needed_bytes` free.

    `path` need not exist yet (its nearest existing parent is measured). The message
    gives both figures in GB (10^9 bytes, as storage guides state them) and `why`.
    Returns the free bytes.
    """
    if needed_bytes < 0:
        raise ValueError(f"needed_bytes must be >= 0, got {needed_bytes}")
    where = _existing_ancestor(Path(path))
    free = shutil.disk_usage(where).free
    if free < needed_bytes:
        raise DataError(
            f"not enough free disk space for {path}: need {needed_bytes / 1e9:,.1f} GB, "
            f"only {free / 1e9:,.1f} GB free on the filesystem of {where}"
            + (f" ({why})" if why else "")
            + ". Free some space or point the data directory at a larger filesystem."
        )
    return free


# ---------------------------------------------------------------------------
# HTTP download
# ---------------------------------------------------------------------------

_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
_CONNECTION_ERRORS = (
    ConnectionError,            # includes ConnectionResetError, BrokenPipeError
    http.client.IncompleteRead,
    http.client.RemoteDisconnected,
    socket.timeout,
    TimeoutError,
)


class _Interrupted(Exception):
    """A transfer stopped early; retried without counting as a failure if it made progress."""


class _RetryLater(Exception):
    def __init__(self, reason: str, wait: float | None):
        super().__init__(reason)
        self.wait = wait


class _StripAuthOnHostChange(urllib.request.HTTPRedirectHandler):
    # urllib carries every header across redirects, so a bearer token would
    # follow a redirect to a CDN or any other host. Keep it for the same host only.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            for name in list(new.headers):
                if name.lower() == "authorization":
                    del new.headers[name]
        return new


_opener = urllib.request.build_opener(_StripAuthOnHostChange)


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _verify_file(path: Path, expected_size: int | None, sha256: str | None) -> str | None:
    """None if `path` matches; otherwise what is wrong."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        return f"size {size:,} bytes, expected {expected_size:,}"
    if sha256 is not None:
        actual = sha256_file(path)
        if actual.lower() != sha256.lower():
            return f"sha256 {actual}, expected {sha256.lower()}"
    return None


def http_download(
    url: str,
    dest: str | os.PathLike,
    *,
    expected_size: int | None = None,
    sha256: str | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    retries: int = 5,
    backoff: float = 2.0,
    max_wait: float = 300.0,
    timeout: float = 60.0,
    chunk_size: int = 1 << 20,
) -> Path:
    """Download `url` to `dest`; resumable, retried, verified, atomic.

    Bytes go to `dest.part`; an interrupted transfer (this call or an earlier
    process) continues from there with `Range: bytes=N-`. 429, 5xx and dropped
    connections are retried up to `retries` times without progress, waiting
    Retry-After when the server gives one and `backoff * 2**k` seconds otherwise
    (at most `max_wait`). When the bytes are all there the size and sha256 are
    checked; a mismatch removes the partial file and raises DownloadError, so
    `dest` exists only when it is right. `token`, if given, is sent as
    `Authorization: Bearer ...` (dropped on redirects to another host) and is
    never part of any message.
    """
    dest = Path(dest)
    part = _part_path(dest)
    secrets = [token]
    shown = _safe_url(url)

    def fail(message: str) -> DownloadError:
        return DownloadError(redact(message, secrets))

    if dest.exists():
        problem = _verify_file(dest, expected_size, sha256)
        if problem is None:
            return dest
        log.warning("%s exists but is wrong (%s); downloading it again", dest, problem)
        dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = 0
    best = part.stat().st_size if part.exists() else 0
    while True:
        try:
            _transfer(url, part, expected_size=expected_size, token=token, headers=headers,
                      timeout=timeout, chunk_size=chunk_size)
            break
        except _Interrupted as exc:
            have = part.stat().st_size if part.exists() else 0
            if have > best:
                # The connection broke mid-body after making progress: resume
                # at once; only transfers that gain nothing count as failures.
                best = have
                log.info("%s", redact(f"download of {shown} interrupted ({exc}); resuming", secrets))
                continue
            failures += 1
            if failures > retries:
                raise fail(f"download of {shown} failed after {retries} retries: {exc}") from None
            time.sleep(min(backoff * 2 ** (failures - 1), max_wait))
        except _RetryLater as exc:
            failures += 1
            if failures > retries:
                raise fail(f"download of {shown} failed after {retries} retries: {exc}") from None
            wait = exc.wait if exc.wait is not None else backoff * 2 ** (failures - 1)
            wait = min(wait, max_wait)
            log.warning("%s", redact(f"download of {shown}: {exc}; retry {failures}/{retries} in {wait:.1f} s", secrets))
            time.sleep(wait)
        except DownloadError as exc:
            raise fail(str(exc)) from None

    problem = _verify_file(part, expected_size, sha256)
    if problem is not None:
        # A wrong file must not be resumed from either: start clean next time.
        part.unlink()
        raise fail(f"download of {shown} is corrupt: {problem}; the partial file was removed")
    with open(part, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(part, dest)
    return dest


def _transfer(url: str, part: Path, *, expected_size: int | None, token: str | None,
              headers: Mapping[str, str] | None, timeout: float, chunk_size: int) -> None:
    """One request: append to `part` until the body ends. Raises _Interrupted / _RetryLater / DownloadError."""
    shown = _safe_url(url)
    offset = part.stat().st_size if part.exists() else 0
    if expected_size is not None and offset > expected_size:
        # Longer than the file can be: it is not a prefix of it.
        part.unlink()
        offset = 0
    if expected_size is not None and offset == expected_size and offset > 0:
        return

    req = urllib.request.Request(url, method="GET")
    req.add_header("User-Agent", "mlrepro-data/1")
    req.add_header("Accept-Encoding", "identity")  # byte offsets must mean file offsets
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if offset:
        req.add_header("Range", f"bytes={offset}-")

    try:
        resp = _opener.open(req, timeout=timeout)
    # Errors are not chained: the HTTP error carries the URL, and signed URLs hold credentials.
    except urllib.error.HTTPError as err:
        with err:
            if err.code == 416 and offset:
                # Nothing beyond `offset`: the partial file is already complete,
                # unless the server's total says otherwise.
                total = _content_range_total(err.headers.get("Content-Range"))
                if total is None or total == offset:
                    return
                part.unlink()
                raise _RetryLater(f"server says the file has {total} bytes, local part has {offset}", 0.0) from None
            if err.code in _RETRY_STATUS:
                raise _RetryLater(f"HTTP {err.code} {err.reason}", _retry_after(err.headers.get("Retry-After"))) from None
            if err.code in (401, 403):
                raise DownloadError(
                    f"download of {shown} refused: HTTP {err.code} {err.reason}. The source needs a valid "
                    f"token with access to it{'' if token else ', and none was given'}.") from None
            raise DownloadError(f"download of {shown} failed: HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, (ConnectionError, socket.timeout, TimeoutError, OSError)):
            raise _RetryLater(f"connection failed: {err.reason}", None) from None
        raise DownloadError(f"download of {shown} failed: {err.reason}") from None
    except _CONNECTION_ERRORS as err:
        raise _RetryLater(f"connection failed: {err!r}", None) from None

    with resp:
        if resp.status == 206:
            start = _content_range_start(resp.headers.get("Content-Range"))
            if start != offset:
                part.unlink(missing_ok=True)
                raise _RetryLater(f"server answered range from {start}, asked from {offset}", 0.0)
            mode = "ab"
        else:
            # 200: the server ignored the Range header; start over.
            mode = "wb"
            offset = 0
        length = resp.headers.get("Content-Length")
        want = int(length) if length and length.isdigit() else None
        got = 0
        try:
            with open(part, mode) as out:
                while block := resp.read(chunk_size):
                    out.write(block)
                    got += len(block)
        except _CONNECTION_ERRORS as err:
            if got:
                raise _Interrupted(f"{err.__class__.__name__} after {offset + got:,} bytes") from None
            raise _RetryLater(f"connection dropped: {err!r}", None) from None
        # http.client returns b"" rather than raising when a body ends short.
        if want is not None and got < want:
            if got:
                raise _Interrupted(f"connection closed after {offset + got:,} bytes")
            raise _RetryLater("connection closed before any data", None)


_CR = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _content_range_start(value: str | None) -> int | None:
    m = _CR.match(value or "")
    return int(m.group(1)) if m else None


def _content_range_total(value: str | None) -> int | None:
    m = re.match(r"bytes\s+(?:\d+-\d+|\*)/(\d+)", value or "")
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------
# Hugging Face Hub
# ---------------------------------------------------------------------------

def hub_download(
    repo_id: str,
    dest_dir: str | os.PathLike,
    *,
    repo_type: str = "model",
    revision: str | None = None,
    allow_patterns: str | Sequence[str] | None = None,
    token_env: str = "HF_TOKEN",
    token_required: bool = False,
    endpoint: str | None = None,
    max_workers: int = 8,
) -> Path:
    """Download a Hub repository (or the files matching `allow_patterns`) into `dest_dir`.

    huggingface_hub resumes partial files itself (`dest_dir/.cache/huggingface`).
    The token comes from `token_env`; with `token_required` a missing token fails
    before any request. `endpoint` defaults to $HF_ENDPOINT, then huggingface.co.
    """
    token = require_token(token_env, purpose=f"download {repo_id}") if token_required \
        else (os.environ.get(token_env, "").strip() or None)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        path = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision,
            local_dir=dest_dir,
            token=token,
            endpoint=endpoint,
            allow_patterns=list(allow_patterns) if isinstance(allow_patterns, (list, tuple)) else allow_patterns,
            max_workers=max_workers,
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        hint = ""
        if status in (401, 403):
            hint = (f" The repository needs a token with access: set {token_env} "
                    f"(and accept the model's license on the Hub).")
        first_line = (str(err).splitlines() or [err.__class__.__name__])[0].rstrip(".")
        raise DownloadError(redact(f"download of {repo_type} {repo_id} failed: {first_line}.{hint}", [token])) from None
    return Path(path)


# ---------------------------------------------------------------------------
# expected-mounts.csv
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpectedEntry:
    """One row of NVIDIA's expected-mounts.csv.

    `key` names the mount (DATADIR, MODEL, PREPROC_DATA, ...), `relative_path`
    is relative to that mount's root ("." is the root), `type` is "file" or
    "dir". For a file, num_files is 1 and num_bytes its size; for a dir, the
    count and total size of all files below it. Hidden files and folders (name
    starting with ".") are not counted, as in NVIDIA's mount check.
    """

    key: str
    type: str
    relative_path: str
    num_files: int
    num_bytes: int


_MOUNT_COLUMNS = ("key", "type", "relative_path", "num_files", "num_bytes")


def read_expected_mounts(csv_path: str | os.PathLike) -> list[ExpectedEntry]:
    """Parse expected-mounts.csv (header: key,type,relative_path,num_files,num_bytes)."""
    csv_path = Path(csv_path)
    try:
        text = csv_path.read_text()
    except OSError as err:
        raise DataError(f"cannot read expected mounts {csv_path}: {err.strerror}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or tuple(c.strip() for c in rows[0]) != _MOUNT_COLUMNS:
        raise DataError(f"{csv_path}: expected the header {','.join(_MOUNT_COLUMNS)}, "
                        f"found {','.join(rows[0]) if rows else 'an empty file'}")
    entries = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(_MOUNT_COLUMNS):
            raise DataError(f"{csv_path}:{lineno}: expected {len(_MOUNT_COLUMNS)} fields, found {len(row)}")
        key, kind, rel, nfiles, nbytes = (c.strip() for c in row)
        if kind not in ("file", "dir"):
            raise DataError(f"{csv_path}:{lineno}: type must be 'file' or 'dir', found {kind!r}")
        try:
            entries.append(ExpectedEntry(key, kind, rel, int(nfiles), int(nbytes)))
        except ValueError:
            raise DataError(f"{csv_path}:{lineno}: num_files and num_bytes must be integers") from None
    return entries


def expected_from_files(key: str, files: Mapping[str, int]) -> list[ExpectedEntry]:
    """Expected entries for a plain {relative path: size} listing, plus its root total."""
    rows = [ExpectedEntry(key, "file", rel, 1, size) for rel, size in files.items()]
    visible = [(rel, size) for rel, size in files.items() if not _is_hidden(rel)]
    rows.append(ExpectedEntry(key, "dir", ".", len(visible), sum(s for _, s in visible)))
    return rows


def _is_hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in Path(rel).parts if part != ".")


def _scan(root: Path) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Sizes of visible files and (count, bytes) of every visible folder under `root`."""
    files: dict[str, int] = {}
    dirs: dict[str, list[int]] = {".": [0, 0]}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirs.setdefault(rel_dir, [0, 0])
        for name in filenames:
            if name.startswith("."):
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                size = os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # dangling link: reported as missing if expected
            files[rel] = size
            # Add to this folder and every ancestor up to the root.
            parent = rel_dir
            while True:
                acc = dirs.setdefault(parent, [0, 0])
                acc[0] += 1
                acc[1] += size
                if parent == ".":
                    break
                parent = Path(parent).parent.as_posix()
    return files, {k: (v[0], v[1]) for k, v in dirs.items()}


def verify_mounts(
    root: str | os.PathLike | Mapping[str, str | os.PathLike],
    expected: Sequence[ExpectedEntry],
    *,
    key: str | None = None,
) -> list[str]:
    """Compare what is on disk with `expected`; return the problems (empty when all is right).

    `root` is either one folder (for the entries of `key`, which may be left
    out when `expected` has a single key) or a mapping {key: folder} such as
    {"DATADIR": ".../gov_report", "MODEL": ".../model"}; then only the keys
    given are checked, like `mountcheck --mounts_to_verify`.
    """
    keys_in_csv = sorted({e.key for e in expected})
    if isinstance(root, Mapping):
        roots = {k: Path(v) for k, v in root.items()}
    else:
        if key is None:
            if len(keys_in_csv) != 1:
                raise ValueError(f"expected mounts list several keys ({', '.join(keys_in_csv)}); "
                                 f"pass key= or a mapping of key to folder")
            key = keys_in_csv[0]
        roots = {key: Path(root)}

    problems: list[str] = []
    for k, folder in roots.items():
        rows = [e for e in expected if e.key == k]
        if not rows:
            problems.append(f"{k}: no expected entries for this key (known: {', '.join(keys_in_csv)})")
            continue
        if not folder.is_dir():
            problems.append(f"{k}: folder {folder} does not exist")
            continue
        files, dirs = _scan(folder)
        for e in rows:
            where = folder / e.relative_path
            if e.type == "file":
                size = files.get(e.relative_path)
                if size is None and where.is_file():  # a hidden file named explicitly
                    size = where.stat().st_size
                if size is None:
                    problems.append(f"{k}: missing file {where} ({e.num_bytes:,} bytes expected)")
                elif size != e.num_bytes:
                    problems.append(f"{k}: {where} is {size:,} bytes, expected {e.num_bytes:,}")
            else:
                rel = Path(e.relative_path).as_posix()
                if rel not in dirs:
                    problems.append(f"{k}: missing folder {where} ({e.num_files} files expected)")
                    continue
                count, total = dirs[rel]
                if count != e.num_files:
                    problems.append(f"{k}: {where} holds {count} files, expected {e.num_files}")
                if total != e.num_bytes:
                    problems.append(f"{k}: {where} holds {total:,} bytes, expected {e.num_bytes:,}")
    return problems


# ---------------------------------------------------------------------------
# manifest
# ---------------------------------------------------------------------------

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
    exclude = ("manifest.json", out_json.name, VERIFIED_STAMP)
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
    from mlrepro.util.fsutil import atomic_write_json as write

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
        write(stamp_path, {"manifest": _stat_key(manifest_json.stat()), "files": verified})
    return problems


# ---------------------------------------------------------------------------
# an implementation's own download scripts
# ---------------------------------------------------------------------------

def container_command(
    container: str | os.PathLike,
    argv: Sequence[str],
    *,
    env_names: Iterable[str] = (),
    mounts: Mapping[str | os.PathLike, str] | None = None,
    workdir: str | None = None,
    engine: str = "podman",
) -> list[str]:
    """The command line that runs `argv` inside `container`.

    A path ending in .sqsh runs with `enroot start` (the image file directly);
    anything else is an image name for `engine run --rm`. Environment variables
    are passed by name only (`--env NAME`): the runtime copies the value from
    its own environment, so secrets never appear on a command line.
    `mounts` maps host paths to container paths; append ":ro" to the container
    path for a read-only mount.
    """
    container = str(container)
    mounts = mounts or {}
    if container.endswith(".sqsh"):
        cmd = ["enroot", "start", "--rw"]
        for name in env_names:
            cmd += ["--env", name]
        for host, inside in mounts.items():
            cmd += ["--mount", f"{Path(host).absolute()}:{inside}"]
        cmd.append(str(Path(container).absolute()))
        if workdir:
            # enroot has no workdir flag; change directory inside the container.
            return cmd + ["sh", "-c", f"cd {shlex.quote(workdir)} && exec \"$@\"", "sh", *argv]
        return cmd + list(argv)
    cmd = [engine, "run", "--rm"]
    for name in env_names:
        cmd += ["--env", name]
    for host, inside in mounts.items():
        cmd += ["--volume", f"{Path(host).absolute()}:{inside}"]
    if workdir:
        cmd += ["--workdir", workdir]
    return cmd + [container, *argv]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_download_script(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    log_path: str | os.PathLike,
    container: str | os.PathLike | None = None,
    mounts: Mapping[str | os.PathLike, str] | None = None,
    workdir: str | os.PathLike | None = None,
    python: str = "python3",
    secrets: Iterable[str] = (),
) -> Path:
    """Run an implementation's download script; its output goes, redacted, to `log_path`.

    `env` is added to this process's environment for the child (put HF_TOKEN
    here: it never goes on the command line, and an argument that contains a
    secret is refused). Values of secret-looking variables (..._TOKEN, ...SECRET,
    ...PASSWORD, ...KEY) and `secrets` are replaced by *** in the log. With
    `container`, the script path is the path inside the container and the
    command is wrapped by `container_command`. A non-zero exit raises DataError
    naming the log and showing its last lines.
    """
    child_env = {**os.environ, **env}
    hidden = secret_values(child_env) + [s for s in secrets if s]
    argv = [python, str(script), *map(str, args)]
    for a in argv:
        if redactor(child_env, hidden).text(a) != a:
            raise DataError("a secret value was given as a command-line argument of the download script; "
                            "pass it through the environment (env=) instead")
    if container is not None:
        cmd = container_command(container, argv, env_names=sorted(env), mounts=mounts,
                                workdir=str(workdir) if workdir else None)
        cwd = None
    else:
        cmd = argv
        cwd = workdir
    return run_logged(cmd, env=env, log_path=log_path, cwd=cwd, secrets=secrets, what=f"download script {script}")


def run_logged(cmd: Sequence[str], *, env: Mapping[str, str], log_path: str | os.PathLike,
               cwd: str | os.PathLike | None = None, secrets: Iterable[str] = (), what: str | None = None) -> Path:
    """Run `cmd` with `env` added to this process's; its output goes, secrets redacted, to `log_path` (appended).

    A non-zero exit raises DataError naming the log and showing its last lines.
    """
    log_path = Path(log_path)
    child_env = {**os.environ, **env}
    hidden = secret_values(child_env) + [s for s in secrets if s]
    what = what or shlex.join(cmd[:2])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    hide = redactor(child_env, hidden)
    with open(log_path, "ab") as out:
        out.write(f"$ {redact(shlex.join(cmd), hidden, env=child_env)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(cmd, env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as err:
            raise DataError(f"cannot start {shlex.join(cmd[:3])} ...: {err.strerror}") from None
        assert proc.stdout is not None
        # Line by line so the log can be followed while it runs; a token never
        # spans a newline, so per-line replacement catches every occurrence.
        for line in proc.stdout:
            out.write(hide.line_bytes(line))
            out.flush()
        rc = proc.wait()
    if rc != 0:
        raise DataError(f"{what} failed with exit status {rc}; see {log_path}. "
                        f"Last lines:\n{_log_tail(log_path)}")
    return log_path


# ---------------------------------------------------------------------------
# documented cleanups (config/benchmarks/llama31_405b.yaml holds the one its README gives)
# ---------------------------------------------------------------------------

def apply_cleanup(folder: str | os.PathLike, cleanup: Mapping) -> list[str]:
    """Carry out a documented download cleanup in `folder`; safe to repeat.

    Removes the files listed under "remove" and replaces each folder under
    "unwrap" by the file of the given name inside it. Returns what was done.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"cannot clean up {folder}: it is not a folder")
    done = []
    for outer, inner in cleanup.get("unwrap", {}).items():
        outer_path = folder / outer
        if not outer_path.is_dir():
            continue
        inner_path = outer_path / inner
        if not inner_path.is_file():
            raise DataError(f"cleanup of {folder}: {outer_path} is a folder without {inner}; "
                            f"the download looks incomplete")
        staged = folder / f".{outer}.unwrap"
        os.replace(inner_path, staged)
        shutil.rmtree(outer_path)
        os.replace(staged, outer_path)
        done.append(f"unwrapped {outer}/{inner}")
    for name in cleanup.get("remove", []):
        target = folder / name
        if target.is_dir():
            shutil.rmtree(target)
            done.append(f"removed {name}/")
        elif target.exists():
            target.unlink()
            done.append(f"removed {name}")
    return done
