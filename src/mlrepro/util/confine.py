"""Paths a configuration names inside a folder must stay inside it.

A config value such as a download script (`scripts/download.py`, run inside the implementation's
folder) or a submitter's name (a folder of the submission package) is joined to a root; `..`, an
absolute path or a symbolic link must not carry it out of that root, where it would run or write
something else.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


def outside(root: str | os.PathLike, relative: str) -> str | None:
    """Why `relative`, joined to `root`, leads outside `root` (None when it stays inside).

    Checked on the text first (absolute, or `..` past the root after normalising), then, where the
    path exists, on what it resolves to (a link out of the root)."""
    if not relative or "\x00" in relative:
        return f"{relative!r} is not a path"
    if PurePosixPath(relative).is_absolute() or Path(relative).is_absolute():
        return f"'{relative}' is an absolute path, outside {root}"
    normal = os.path.normpath(relative)
    if normal == ".." or normal.startswith(".." + os.sep):
        return f"'{relative}' leads outside {root}"
    root = Path(root)
    target = root / relative
    if os.path.lexists(target):
        try:
            resolved, base = target.resolve(), root.resolve()
        except (OSError, RuntimeError) as exc:  # a link loop
            return f"'{relative}' cannot be resolved ({exc})"
        if not resolved.is_relative_to(base):
            return f"'{relative}' resolves to {resolved}, outside {root}"
    return None
