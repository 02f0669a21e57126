"""Downloading a Hugging Face Hub repository through huggingface_hub."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

from mlrepro.util.secrets import redact
from mlrepro.data.checks import DownloadError, require_token

log = logging.getLogger(__name__)



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
