"""Fetching an implementation at a pinned commit (git, or a local folder), verified and swapped into place atomically."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from mlrepro.implementation.configs import ImplementationError
from mlrepro.paths import read_json_if_exists
from mlrepro.util.fsutil import atomic_dir
from mlrepro.util.proc import run

log = logging.getLogger(__name__)


_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_RECORD = ".mlrepro-source.json"


class FetchError(ImplementationError):
    """The implementation could not be fetched or verified at the pinned commit."""


def _git(args: Sequence[str], cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """git (util.proc.run), never prompting; failures raise FetchError."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ADVICE="0", LC_ALL="C")
    return run(["git", "-c", "advice.detachedHead=false", *args], error=FetchError, env=env, cwd=cwd, check=check,
               what=f"git {' '.join(args)}")


def _is_local_folder(source: str) -> bool:
    return "://" not in source and not re.match(r"^[\w.-]+@[\w.-]+:", source) and Path(source).is_dir()


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != _RECORD and ".git" not in p.relative_to(root).parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _verified_checkout(dest: Path, commit: str, folder: str) -> bool:
    if not (dest / ".git").exists():
        return False
    head = _git(["rev-parse", "HEAD"], cwd=dest, check=False)
    if head.returncode != 0 or head.stdout.strip() != commit:
        return False
    if folder and not (dest / folder).is_dir():
        return False
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], cwd=dest, check=False)
    return dirty.returncode == 0 and not dirty.stdout.strip()


def fetch_implementation(
    repo_url: str,
    commit: str | None,
    folder: str | None,
    dest: str | os.PathLike,
) -> Path:
    """Bring an implementation into `dest` at a pinned commit and return its folder.

    `repo_url` is a git URL (https://, file://, ssh) fetched with --depth 1 at
    `commit` (a full 40-character sha), checking out only `folder` where git's sparse
    checkout allows; HEAD is verified to equal `commit`. Or `repo_url` is a plain
    local folder (commit None): `folder` inside it is copied. Either way the result
    is staged beside `dest` and renamed into place, and a `dest` already holding the
    verified commit (or an identical copy of the local folder) is reused untouched.
    Returns `dest / folder` (or `dest` when `folder` is empty).
    """
    dest = Path(dest)
    folder = (folder or "").strip("/")
    if not commit:
        if not _is_local_folder(repo_url):
            raise FetchError(
                f"{repo_url}: a git repository needs a pinned commit (the full 40-character sha); "
                "only a local folder may be used without one"
            )
        return _copy_local_folder(Path(repo_url), folder, dest)

    commit = commit.strip().lower()
    if not _FULL_SHA.match(commit):
        raise FetchError(
            f"commit {commit!r} is not a full 40-character sha; pin the implementation to an exact commit"
        )
    target = dest / folder if folder else dest
    if _verified_checkout(dest, commit, folder):
        log.info("reusing %s at %s", dest, commit)
        return target

    with atomic_dir(dest, keep_on_error=False) as staged:
        _checkout(repo_url, commit, folder, staged)
    log.info("fetched %s at %s into %s", repo_url, commit, dest)
    return target


def _checkout(repo_url: str, commit: str, folder: str, staged: Path) -> None:
    """`commit` of `repo_url` checked out in the empty folder `staged` (only `folder`, where sparse checkout allows)."""
    _git(["init", "--quiet", str(staged)])
    _git(["remote", "add", "origin", repo_url], cwd=staged)
    if folder:
        _git(["sparse-checkout", "set", "--cone", folder], cwd=staged)
    shallow = _git(["fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", commit],
                   cwd=staged, check=False)
    if shallow.returncode != 0:
        # Some servers refuse to hand out a commit by sha; a full fetch still finds it
        # when it is reachable from a branch or tag.
        full = _git(["fetch", "--quiet", "--tags", "origin", "+refs/heads/*:refs/remotes/origin/*"],
                    cwd=staged, check=False)
        if full.returncode != 0:
            raise FetchError(f"could not fetch {repo_url}:\n{full.stderr.strip() or shallow.stderr.strip()}")
        if _git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=staged, check=False).returncode != 0:
            raise FetchError(f"commit {commit} is not in {repo_url} (git said: {shallow.stderr.strip()})")
    _git(["checkout", "--quiet", "--detach", commit], cwd=staged)
    head = _git(["rev-parse", "HEAD"], cwd=staged).stdout.strip()
    if head != commit:
        raise FetchError(f"{repo_url}: checked out {head} but the pinned commit is {commit}")
    if folder and not (staged / folder).is_dir():
        raise FetchError(f"{repo_url} at {commit} has no folder {folder!r}")
    record = {"source": repo_url, "commit": commit, "folder": folder}
    (staged / ".git" / _RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _copy_local_folder(source_root: Path, folder: str, dest: Path) -> Path:
    source = source_root / folder if folder else source_root
    if not source.is_dir():
        raise FetchError(f"implementation folder not found: {source}")
    target = dest / folder if folder else dest
    digest = _tree_digest(source)
    record_path = dest / _RECORD
    if target.is_dir():
        record = read_json_if_exists(record_path) or {}
        if record.get("tree_sha256") == digest and _tree_digest(target) == digest:
            log.info("reusing copy of %s in %s", source, dest)
            return target
    with atomic_dir(dest, keep_on_error=False) as staged:
        shutil.copytree(source, staged / folder if folder else staged, symlinks=True,
                        ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
        record = {"source": str(source_root.resolve()), "commit": None, "folder": folder, "tree_sha256": digest}
        (staged / _RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return target
