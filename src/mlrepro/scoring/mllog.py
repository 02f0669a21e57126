"""Read MLLOG records out of any log a training run leaves behind.

Accepted inputs: raw srun output (``0: :::MLLOG {...}`` with rank prefixes and
plenty of non-MLLOG noise), NVIDIA's ``result_N.txt`` and our own ``mllog.txt``.
Parsing never raises on bad content: truncated JSON, binary garbage, records
missing fields and lines from several ranks are set aside and described in
``ParsedLog.problems``, so a scorer can say *why* a run does not count.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrepro.util.fsutil import NotRegularFile, atomic_write_bytes, open_regular

TOKEN = ":::MLLOG"
# The official parser (mlperf_logging.compliance_checker.mlp_parser) reads files
# as latin-1 and splits on universal newlines; we split the same way so that line
# numbers in our problems match what the official tools report.
_NEWLINES = re.compile(r"\r\n|\r|\n")
# Prefixes that name the rank that printed a line: `srun -l` ("12: ") and
# Open MPI's --tag-output ("[1,12]<stdout>:").
_SRUN_RANK = re.compile(r"^\s*(\d+)\s*:\s")
_OMPI_RANK = re.compile(r"^\s*\[\d+,(\d+)\]<std(?:out|err)>:")
_MAX_PROBLEMS = 20
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Record:
    """One MLLOG event."""

    key: str
    value: Any
    metadata: dict
    time_ms: float
    event_type: str | None
    lineno: int  # 1-based line number in the source log
    rank: int | None  # from the line prefix, when the launcher printed one
    json_text: str  # the record exactly as it was logged, for re-emission

    @property
    def line(self) -> str:
        return f"{TOKEN} {self.json_text}"


@dataclass
class ParsedLog:
    """The MLLOG records of one log, in log order, plus what went wrong reading it."""

    source: str
    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # ranks that printed MLLOG lines
    rank_used: int | None = None
    lines_read: int = 0

    def all(self, key: str) -> list[Record]:
        return [r for r in self.records if r.key == key]

    def first(self, key: str) -> Record | None:
        return next((r for r in self.records if r.key == key), None)

    def last(self, key: str) -> Record | None:
        return next((r for r in reversed(self.records) if r.key == key), None)

    def value(self, key: str, default: Any = None) -> Any:
        rec = self.first(key)
        return default if rec is None else rec.value

    def to_text(self) -> str:
        """The clean MLLOG text: one ``:::MLLOG {...}`` line per kept record."""
        return "".join(r.line + "\n" for r in self.records)

    def to_bytes(self) -> bytes:
        """`to_text()` as the bytes the log had (logs are read as latin-1)."""
        return self.to_text().encode("latin-1", errors="replace")


class _Problems:
    """Collects problems, keeping the list short on pathological logs."""

    def __init__(self, out: list[str]):
        self.out = out
        self.dropped = 0

    def add(self, msg: str) -> None:
        if len(self.out) < _MAX_PROBLEMS:
            self.out.append(msg)
        else:
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            self.out.append(f"... and {self.dropped} more problems of the same kinds")


def _rank_of(prefix: str) -> int | None:
    m = _SRUN_RANK.match(prefix) or _OMPI_RANK.match(prefix)
    return int(m.group(1)) if m else None


def _check_record(obj: Any) -> str | None:
    """Why a decoded JSON object is not a usable MLLOG record (None if it is)."""
    if not isinstance(obj, dict):
        return "MLLOG payload is not a JSON object"
    missing = [k for k in ("key", "time_ms", "value", "metadata") if k not in obj]
    if missing:
        return f"MLLOG record lacks {', '.join(missing)}"
    if not isinstance(obj["key"], str) or not obj["key"]:
        return "MLLOG record has no key name"
    t = obj["time_ms"]
    if finite(t) is None:
        return f"MLLOG record {obj['key']!r} has a bad time_ms {_shown(t)}"
    if not isinstance(obj["metadata"], dict):
        return f"MLLOG record {obj['key']!r} has metadata that is not an object"
    return None


def finite(x: Any) -> float | None:
    """`x` as a finite float, or None when it is not a number or does not fit one.

    JSON integers have no size limit: one of 400 digits overflows a float, and
    math.isfinite would raise on it.
    """
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        value = float(x)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _shown(value: Any, limit: int = 40) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"(an integer of about {int(value.bit_length() * 0.30103)} digits)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    """Parse the MLLOG records of a log given as text. Never raises."""
    log = ParsedLog(source=source)
    problems = _Problems(log.problems)
    found: list[Record] = []
    lines = _NEWLINES.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    log.lines_read = len(lines)
    for lineno, line in enumerate(lines, start=1):
        if TOKEN not in line:
            continue
        parts = line.split(TOKEN)
        rank = _rank_of(parts[0])
        # Several records on one line happen when ranks write to one stream
        # without line buffering; each piece is tried on its own.
        for piece in parts[1:]:
            body = piece.lstrip(" ")
            try:
                obj, end = _DECODER.raw_decode(body)
            except (ValueError, RecursionError) as exc:
                # ValueError besides JSONDecodeError: an integer longer than Python's
                # int-conversion limit (4,300 digits).
                msg = (exc.msg if isinstance(exc, json.JSONDecodeError)
                       else "nested too deeply" if isinstance(exc, RecursionError) else "a number too long")
                problems.add(f"line {lineno}: unreadable MLLOG record (truncated or corrupt JSON: {msg})")
                continue
            why = _check_record(obj)
            if why:
                problems.add(f"line {lineno}: {why}")
                continue
            if body[end:].strip():
                problems.add(f"line {lineno}: text after the MLLOG record ignored")
            found.append(
                Record(
                    key=obj["key"],
                    value=obj["value"],
                    metadata=obj["metadata"],
                    time_ms=finite(obj["time_ms"]),
                    event_type=obj.get("event_type") if isinstance(obj.get("event_type"), str) else None,
                    lineno=lineno,
                    rank=rank,
                    json_text=body[:end],
                )
            )
    ranks = sorted({r.rank for r in found if r.rank is not None})
    log.ranks = ranks
    if len(ranks) > 1:
        # Every rank of a job may print the same record; it is one event, read once (the lowest
        # rank's copy). A record only another rank printed is kept: unet3d logs run_stop and its
        # evaluations from rank 56 (v4.0 smc, Oracle), and the official parser reads every rank.
        # Unprefixed lines come from a single stream and are kept.
        log.rank_used = ranks[0]
        first: dict[str, int] = {}
        kept = []
        for rec in sorted(found, key=lambda r: (r.rank is not None and r.rank != ranks[0], r.lineno)):
            if rec.rank is None or first.setdefault(rec.json_text, rec.rank) == rec.rank:
                kept.append(rec)
        dropped = len(found) - len(kept)
        problems.add(f"MLLOG lines from {len(ranks)} ranks ({_short_list(ranks)}); {dropped} copies of records "
                     f"another rank printed were read once")
        found = sorted(kept, key=lambda r: r.lineno)
    elif ranks:
        log.rank_used = ranks[0]
    log.records = found
    if not found:
        problems.add("no MLLOG records found")
    problems.close()
    return log


def _short_list(items: list[int], n: int = 8) -> str:
    s = ", ".join(str(i) for i in items[:n])
    return s + (f", ... ({len(items)} in all)" if len(items) > n else "")


def parse_log(path: str | os.PathLike) -> ParsedLog:
    """Parse the MLLOG records of the log at `path`. Never raises: an unreadable
    file (or a FIFO, socket or device) gives a ParsedLog with no records and the
    reason in `problems`."""
    path = Path(path)
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except NotRegularFile:
        return ParsedLog(source=str(path), problems=[f"{path} is not a regular file; not read"])
    except OSError as exc:
        return ParsedLog(source=str(path), problems=[f"cannot read {path}: {exc.strerror or exc}"])
    # latin-1 maps every byte to a character, so binary garbage cannot make
    # decoding fail, and it is what the official tools use.
    return parse_text(data.decode("latin-1"), source=str(path))


def extract_mllog(src: str | os.PathLike, dst: str | os.PathLike) -> ParsedLog:
    """Write the clean MLLOG lines of the raw log `src` to `dst` (atomically).

    The result keeps each record's original JSON text, so the official tools
    read the same values from `dst` as from the raw log.
    """
    log = parse_log(src)
    atomic_write_bytes(dst, log.to_bytes())
    return log


def contains_mllog(path: str | os.PathLike) -> bool:
    """Whether the file at `path` has at least one MLLOG marker (cheap sniff).

    False for anything but a regular file: a FIFO in a scanned folder must not hang us.
    """
    marker = TOKEN.encode()
    try:
        with open_regular(path) as fh:
            tail = b""
            while block := fh.read(1 << 20):
                if marker in tail + block:
                    return True
                tail = block[-len(marker):]
    except OSError:
        return False
    return False
