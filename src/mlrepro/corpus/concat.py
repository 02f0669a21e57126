"""Shards → one jsonl chunk, in a stable order, byte-identical on every rerun.

Unlike `cat`, a shard whose last line lacks its newline does not glue its last document to
the next shard's first one: a newline is added between them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mlrepro.util.fsutil import atomic_path


def concatenate(files: list[Path], out: Path) -> int:
    """Write `files` one after the other into `out` (atomically); the bytes written."""
    total = 0
    with atomic_path(out) as tmp, open(tmp, "wb") as fout:
        for path in files:
            with open(path, "rb") as fin:
                shutil.copyfileobj(fin, fout, 1 << 20)
                size = fin.tell()
                total += size
                if size:
                    fin.seek(size - 1)
                    if fin.read(1) != b"\n":
                        fout.write(b"\n")
                        total += 1
    return total
