"""Megatron-LM at the commit a GPT benchmark pins: fetched (the implementation fetcher, sparse to
megatron/ plus the top-level scripts) and packed as the tarball a machine without network is given."""

from __future__ import annotations

import tarfile
from pathlib import Path

from mlrepro.implementation import fetch as implementation
from mlrepro.util.fsutil import atomic_path

# What pretrain_gpt.py imports from the top level of the repository, besides the megatron package.
TOP_LEVEL = ("pretrain_gpt.py", "gpt_builders.py", "model_provider.py")


def fetch(url: str, commit: str, dest: str | Path) -> Path:
    """The checkout at `commit` (verified), with pretrain_gpt.py and megatron/ present."""
    implementation.fetch_implementation(url, commit, "megatron", dest)
    dest = Path(dest)
    if not (dest / "pretrain_gpt.py").is_file():
        raise implementation.FetchError(f"{url} at {commit} has no pretrain_gpt.py: not a Megatron-LM GPT commit")
    return dest


def pack(checkout: str | Path, out: str | Path) -> Path:
    """A .tar.gz of megatron/ and the top-level scripts present (what the device run carries)."""
    checkout, out = Path(checkout), Path(out)
    with atomic_path(out) as tmp, tarfile.open(tmp, "w:gz") as tar:
        tar.add(checkout / "megatron", arcname="megatron",
                filter=lambda info: None if "__pycache__" in info.name else info)
        for name in TOP_LEVEL:
            if (checkout / name).is_file():
                tar.add(checkout / name, arcname=name)
    return out
