"""NVIDIA's expected-mounts.csv, checked against what is on disk (files present, file counts, byte totals)."""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence
from mlrepro.data.checks import DataError


log = logging.getLogger(__name__)



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
