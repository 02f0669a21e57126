"""zstd shards → jsonl files, streamed with the `zstandard` package, in parallel threads.

A shard is decompressed into a temporary file renamed into place when its last frame has ended
(a .zst truncated or corrupt in any of its frames raises, naming the file); only then, and only if
asked, is the compressed shard removed, as `unzstd --rm` does. Files that are not compressed are used as
they are. An output that is already there is complete (it was renamed into place) and skipped.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zstandard

from mlrepro.util.fsutil import NotRegularFile, atomic_path, open_regular

log = logging.getLogger(__name__)

# Compressed bytes per read: what one read decompresses to stays in memory until written.
FRAME_READ = 1 << 18


class ExtractError(RuntimeError):
    """A shard cannot be decompressed."""


def extracted_name(name: str) -> str:
    return name[:-4] if name.endswith(".zst") else name


def decompress(src: Path, dest: Path) -> int:
    """Stream-decompress every frame of `src` into `dest` atomically; the number of bytes written.

    `dest` appears only once the last frame has ended: a shard cut short inside any frame, or with
    bytes after its last frame that are not one, raises ExtractError naming `src` and leaves no `dest`."""
    written = 0
    with _open_regular(src) as fin, atomic_path(dest) as tmp, open(tmp, "wb") as fout:
        for chunk in frames(fin, str(src)):
            fout.write(chunk)
            written += len(chunk)
    return written


def _open_regular(src: Path):
    """`src` for reading, if it is a regular file: a FIFO would block the open, a folder fail obscurely."""
    try:
        return open_regular(src)
    except NotRegularFile as exc:
        raise ExtractError(f"{src}: {exc.what}, not a regular file (a shard is a .zst file)") from None
    except OSError as exc:
        raise ExtractError(f"{src}: cannot open: {exc.strerror or exc}") from None


def frames(fh, name: str):
    """The decompressed bytes of every zstd frame in the stream `fh`, checking that each one ends.

    zstandard's stream_reader(read_across_frames=True) returns what it has when the input stops
    inside a frame, and a decompressobj stops at the end of the first frame; so frames are
    decompressed one after the other here, each to its end."""
    dctx = zstandard.ZstdDecompressor()
    frame, fed, count, offset = dctx.decompressobj(), False, 0, 0
    try:
        while block := fh.read(FRAME_READ):
            offset += len(block)
            while block:
                fed = True
                out = frame.decompress(block)
                if out:
                    yield out
                if not frame.eof:
                    break
                count += 1
                block = frame.unused_data
                frame, fed = dctx.decompressobj(), False
    except zstandard.ZstdError as exc:
        raise ExtractError(f"{name}: corrupt zstd data after {count} complete frame(s) ({exc})") from None
    if fed:
        raise ExtractError(f"{name}: the zstd stream is truncated: frame {count + 1} does not end "
                           f"({offset} bytes read)")
    if count == 0:
        raise ExtractError(f"{name}: empty, not a zstd stream")


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


def extract_all(srcs: list[Path], dest_dir: Path, *, workers: int = 2, delete_compressed: bool = False,
                refetch=None) -> list[Path]:
    """Extract every shard; `refetch(src, error)`, when given, brings a shard that does not decompress
    again (True) or declines (False): that shard is then extracted once more, and its error raised
    if it still fails."""
    dest_dir.mkdir(parents=True, exist_ok=True)

    def one(src: Path) -> Path:
        try:
            return extract_one(src, dest_dir, delete_compressed)
        except ExtractError as exc:
            if refetch is None or not refetch(src, exc):
                raise
        return extract_one(src, dest_dir, delete_compressed)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, srcs))
