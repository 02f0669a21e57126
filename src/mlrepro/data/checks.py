"""What a data stage checks before it fetches anything (the token, the free space), and the data errors."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Mapping


log = logging.getLogger(__name__)



GIB = 1024**3


class DataError(RuntimeError):
    """A data or checkpoint step cannot go on; the message says why and what to do."""


class MissingTokenError(DataError):
    pass


class DownloadError(DataError):
    pass



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
