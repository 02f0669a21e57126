"""An image's build context: the files a build sends (.dockerignore honoured, as Docker matches it) and
their digest, which decides whether the image must be built again."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Sequence

from mlrepro.util.fsutil import sha256_file


class ContainerError(Exception):
    """A container build, export or push failed; the message says which and why."""


def _dockerignore_rules(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per .dockerignore line, in file order; the last match decides."""
    ignore_file = context / ".dockerignore"
    if not ignore_file.is_file():
        return []
    rules = []
    for raw in ignore_file.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if negate else line).lstrip("/")
        if pattern in ("", "."):
            continue
        rules.append((negate, re.compile(_pattern_regex(pattern))))
    return rules


def _segment_regex(segment: str) -> str:
    out, i = [], 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[" and "]" in segment[i + 1:]:
            end = segment.index("]", i + 1)
            body = segment[i + 1:end]
            if body.startswith(("!", "^")):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        elif ch == "\\" and i + 1 < len(segment):
            i += 1
            out.append(re.escape(segment[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def _pattern_regex(pattern: str) -> str:
    # Docker's matching: `**` spans any number of folders, `*` and `?` stay within one,
    # and a pattern that names a folder covers everything beneath it.
    out = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:.*/)?")
        else:
            out.append(_segment_regex(part) + ("" if last else "/"))
    return "^" + "".join(out) + "(?:/.*)?$"


def _ignored(rel: str, rules: Sequence[tuple[bool, re.Pattern[str]]]) -> bool:
    ignored = False
    for negate, regex in rules:
        if regex.match(rel):
            ignored = not negate
    return ignored


def context_files(context_dir: str | os.PathLike, dockerfile: str | os.PathLike | None = None) -> list[str]:
    """Relative paths of the files a build would send, after .dockerignore, sorted."""
    context = Path(context_dir)
    if not context.is_dir():
        raise ContainerError(f"build context is not a folder: {context}")
    rules = _dockerignore_rules(context)
    always = {".dockerignore"}
    if dockerfile is not None:
        try:
            always.add(Path(dockerfile).resolve().relative_to(context.resolve()).as_posix())
        except ValueError:
            pass
    files = []
    for root, dirs, names in os.walk(context):
        rel_root = Path(root).relative_to(context).as_posix()
        for name in names:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel in always or not _ignored(rel, rules):
                files.append(rel)
        dirs.sort()
    return sorted(files)


def context_digest(context_dir: str | os.PathLike, dockerfile: str | os.PathLike | None = None) -> str:
    """sha256 over the build context (path, executable bit, content; .dockerignore honoured) and the Dockerfile."""
    context = Path(context_dir)
    h = hashlib.sha256()
    for rel in context_files(context, dockerfile):
        path = context / rel
        st = path.lstat()
        h.update(rel.encode() + b"\0")
        if stat.S_ISLNK(st.st_mode):
            h.update(b"link\0" + os.readlink(path).encode() + b"\0")
        else:
            h.update(b"x\0" if st.st_mode & 0o111 else b"-\0")
            h.update(sha256_file(path).encode() + b"\0")
    if dockerfile is not None:
        df = Path(dockerfile)
        if not df.is_file():
            raise ContainerError(f"Dockerfile not found: {df}")
        h.update(b"dockerfile\0" + df.name.encode() + b"\0" + sha256_file(df).encode())
    return "sha256:" + h.hexdigest()
