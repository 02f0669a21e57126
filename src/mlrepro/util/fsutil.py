"""Files the workflow trusts: atomic writes of files and folders, content hashes, private permissions.

Every target the workflow trusts is written through these helpers: a temporary
sibling is filled, flushed and renamed over the target, so an interrupted stage
leaves either the old target or none, never a half-written one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterator


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def locked(lock_file: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (made, with its folder, if missing): one process at a time
    in the block, across processes and machines that share the file system's locks."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def current_umask() -> int:
    """The process's umask, read without setting it: os.umask(0) to learn it would leave it 0 for a
    moment, and a file another thread makes then (a progress meter's, a band watcher's) is open to all."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o077)  # no /proc: the brief value is the strictest, never the most open
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it over `target` on success.

    On an exception the temporary file is removed and `target` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    # mkstemp creates 0600; targets are ordinary files, readable as the umask allows.
    os.fchmod(fd, 0o666 & ~current_umask())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
        _fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(target: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as strict JSON: NaN or Infinity (which JSON has not) raise ValueError."""
    atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, *, resume: bool = False, keep_on_error: bool = True) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; it replaces `target` on success.

    A folder left behind by an earlier interrupted attempt (`.NAME.partial`) is
    emptied first, unless `resume`: then it is handed back as it is, for downloads
    that check what they resume (the caller answers for whatever else it holds).
    Without `keep_on_error` an error removes the temporary folder (nothing to resume).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.partial"
    if not resume and partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(exist_ok=True)
    try:
        yield partial
    except BaseException:
        if not keep_on_error:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    _fsync_dir(target.parent)


def unpack_tar(archive: str | os.PathLike, folder: str | os.PathLike) -> None:
    """Extract `archive` into `folder`, refusing any member that would land outside it (an absolute or `..`
    path, a link pointing out, a device): tarfile's own "data" filter where this Python has it (3.11.4+),
    the same checks made here on Debian 12's 3.11.2, which has not."""
    folder = Path(folder).resolve()
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(folder, filter="data")
            return
        for member in tar.getmembers():
            where = (folder / member.name).resolve()
            target = (where.parent / member.linkname).resolve() if member.issym() else \
                (folder / member.linkname).resolve() if member.islnk() else where
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()) or \
                    folder not in (where, *where.parents) or folder not in (target, *target.parents):
                raise tarfile.TarError(f"{archive}: member {member.name!r} would land outside {folder}")
        tar.extractall(folder)


def _digest(h, path: str | os.PathLike, chunk: int) -> str:
    """The hex digest of the file through the hash object `h`, read `chunk` bytes at a time."""
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    return _digest(hashlib.sha256(), path, chunk)


def xxh3_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """XXH3-128 of the file: a content hash at disk speed (about 9 GB/s here, sha256 1.2 GB/s),
    fit for noticing changed files, not for defeating a forger."""
    import xxhash

    return _digest(xxhash.xxh3_128(), path, chunk)


def file_manifest(root: str | os.PathLike, exclude: tuple[str, ...] = ("manifest.json",), *,
                  sha256: bool = True) -> list[dict]:
    """Files under `root` (relative path, size, xxh3_128, and sha256 unless told not to), sorted by path."""
    root = Path(root)
    rows = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in exclude:
            row = {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "xxh3_128": xxh3_file(p)}
            if sha256:
                row["sha256"] = sha256_file(p)
            rows.append(row)
    return rows


PRIVATE_UMASK = 0o077


def private_umask() -> None:
    """Files and folders the workflow creates from now on are the user's alone: job records,
    logs and submitit's pickles hold run parameters."""
    os.umask(PRIVATE_UMASK)


class NotRegularFile(OSError):
    """A path names a folder, FIFO, socket or device: reading it could block forever or fail obscurely.
    `what` says which, in words ("a folder", "a FIFO", "a special file")."""

    def __init__(self, path: str | os.PathLike, what: str):
        super().__init__(f"{path} is not a regular file")
        self.what = what


def open_regular(path: str | os.PathLike):
    """Open `path` for binary reading if it is a regular file (following links). The open does not block
    on a FIFO (O_NONBLOCK: a plain open() waits for a writer that may never come); anything but a
    regular file raises NotRegularFile, a failed open the OSError of os.open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                                 else "a special file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
