"""zstd shards → jsonl files, streamed with the `zstandard` package, in parallel threads.

A shard is decompressed into a temporary file renamed into place when the frame has ended
(a truncated or corrupt .zst raises, naming the file); only then, and only if asked, is the
compressed shard removed, as `unzstd --rm` does. Files that are not compressed are used as
they are. An output that is already there is complete (it was renamed into place) and skipped.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zstandard

from mlrepro.util.fsutil import atomic_path

log = logging.getLogger(__name__)

READ_SIZE = 1 << 20


class ExtractError(RuntimeError):
    """A shard cannot be decompressed."""


def extracted_name(name: str) -> str:
    return name[:-4] if name.endswith(".zst") else name


def decompress(src: Path, dest: Path) -> int:
    """Stream-decompress `src` into `dest` atomically; the number of bytes written."""
    written = 0
    dctx = zstandard.ZstdDecompressor()
    try:
        with open(src, "rb") as fin, atomic_path(dest) as tmp, open(tmp, "wb") as fout:
            reader = dctx.stream_reader(fin, read_across_frames=True, closefd=False)
            while chunk := reader.read(READ_SIZE):
                fout.write(chunk)
                written += len(chunk)
            fout.flush()
            # A stream that stops inside a frame returns no error from read(); check the end.
            if fin.tell() != os.fstat(fin.fileno()).st_size:
                raise ExtractError(f"{src}: trailing bytes after the last zstd frame")
            _check_complete(src)
    except zstandard.ZstdError as exc:
        raise ExtractError(f"{src}: not a valid zstd stream ({exc})") from None
    return written


def _check_complete(src: Path) -> None:
    """Raise if the last frame of `src` is cut short (zstandard's reader stops silently there)."""
    dobj = zstandard.ZstdDecompressor().decompressobj()
    with open(src, "rb") as fh:
        while block := fh.read(READ_SIZE):
            try:
                dobj.decompress(block)
            except zstandard.ZstdError as exc:
                raise ExtractError(f"{src}: corrupt zstd data ({exc})") from None
    if not dobj.eof:
        raise ExtractError(f"{src}: the zstd stream is truncated (the last frame does not end)")


def extract_one(src: Path, dest_dir: Path, delete_compressed: bool = False) -> Path:
    out = dest_dir / extracted_name(src.name)
    if out.exists():
        if delete_compressed and src.exists() and src.name.endswith(".zst"):
            src.unlink()
        return out
    if not src.name.endswith(".zst"):
        return src
    size = decompress(src, out)
    log.info("extracted %s (%d bytes)", src.name, size)
    if delete_compressed:
        src.unlink()
    return out


def extract_all(srcs: list[Path], dest_dir: Path, *, workers: int = 2, delete_compressed: bool = False) -> list[Path]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: extract_one(s, dest_dir, delete_compressed), srcs))
