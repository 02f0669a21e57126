"""Downloading one file over HTTP(S): resumable, retried on 429/5xx and dropped connections, verified, renamed into place when complete.

Secrets: a token reaches the server only in an `Authorization` header; every message this module raises or logs has the token value replaced by `***`.
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

from mlrepro.util.fsutil import sha256_file
from mlrepro.util.secrets import redact
from mlrepro.data.checks import DownloadError

log = logging.getLogger(__name__)



def _safe_url(url: str) -> str:
    """The URL without query string or user info: signed URLs carry credentials there."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
_CONNECTION_ERRORS = (
    ConnectionError,            # includes ConnectionResetError, BrokenPipeError
    http.client.IncompleteRead,
    http.client.RemoteDisconnected,
    socket.timeout,
    TimeoutError,
)


class _Interrupted(Exception):
    """A transfer stopped early; retried without counting as a failure if it made progress."""


class _RetryLater(Exception):
    def __init__(self, reason: str, wait: float | None):
        super().__init__(reason)
        self.wait = wait


class _StripAuthOnHostChange(urllib.request.HTTPRedirectHandler):
    # urllib carries every header across redirects, so a bearer token would
    # follow a redirect to a CDN or any other host. Keep it for the same host only.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            for name in list(new.headers):
                if name.lower() == "authorization":
                    del new.headers[name]
        return new


_opener = urllib.request.build_opener(_StripAuthOnHostChange)


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def verify_file(path: Path, expected_size: int | None, sha256: str | None) -> str | None:
    """None if `path` matches; otherwise what is wrong."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        return f"size {size:,} bytes, expected {expected_size:,}"
    if sha256 is not None:
        actual = sha256_file(path)
        if actual.lower() != sha256.lower():
            return f"sha256 {actual}, expected {sha256.lower()}"
    return None


def http_download(
    url: str,
    dest: str | os.PathLike,
    *,
    expected_size: int | None = None,
    sha256: str | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    retries: int = 5,
    backoff: float = 2.0,
    max_wait: float = 300.0,
    timeout: float = 60.0,
    chunk_size: int = 1 << 20,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Download `url` to `dest`; resumable, retried, verified, atomic.

    Bytes go to `dest.part`; an interrupted transfer (this call or an earlier
    process) continues from there with `Range: bytes=N-`. 429, 5xx and dropped
    connections are retried up to `retries` times without progress, waiting
    Retry-After when the server gives one and `backoff * 2**k` seconds otherwise
    (at most `max_wait`). When the bytes are all there the size and sha256 are
    checked; a mismatch removes the partial file and raises DownloadError, so
    `dest` exists only when it is right. `token`, if given, is sent as
    `Authorization: Bearer ...` (dropped on redirects to another host) and is
    never part of any message. `progress(n)` is told of every block of n bytes
    written (a util.progress.Meter's add; a restarted transfer's bytes count again).
    """
    dest = Path(dest)
    part = _part_path(dest)
    secrets = [token]
    shown = _safe_url(url)

    def fail(message: str) -> DownloadError:
        return DownloadError(redact(message, secrets))

    if dest.exists():
        problem = verify_file(dest, expected_size, sha256)
        if problem is None:
            return dest
        log.warning("%s exists but is wrong (%s); downloading it again", dest, problem)
        dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = 0
    best = part.stat().st_size if part.exists() else 0
    while True:
        try:
            _transfer(url, part, expected_size=expected_size, token=token, headers=headers,
                      timeout=timeout, chunk_size=chunk_size, progress=progress)
            break
        except _Interrupted as exc:
            have = part.stat().st_size if part.exists() else 0
            if have > best:
                # The connection broke mid-body after making progress: resume
                # at once; only transfers that gain nothing count as failures.
                best = have
                log.info("%s", redact(f"download of {shown} interrupted ({exc}); resuming", secrets))
                continue
            failures += 1
            if failures > retries:
                raise fail(f"download of {shown} failed after {retries} retries: {exc}") from None
            time.sleep(min(backoff * 2 ** (failures - 1), max_wait))
        except _RetryLater as exc:
            failures += 1
            if failures > retries:
                raise fail(f"download of {shown} failed after {retries} retries: {exc}") from None
            wait = exc.wait if exc.wait is not None else backoff * 2 ** (failures - 1)
            wait = min(wait, max_wait)
            log.warning("%s", redact(f"download of {shown}: {exc}; retry {failures}/{retries} in {wait:.1f} s", secrets))
            time.sleep(wait)
        except DownloadError as exc:
            raise fail(str(exc)) from None

    problem = verify_file(part, expected_size, sha256)
    if problem is not None:
        # A wrong file must not be resumed from either: start clean next time.
        part.unlink()
        raise fail(f"download of {shown} is corrupt: {problem}; the partial file was removed")
    with open(part, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(part, dest)
    return dest


def _transfer(url: str, part: Path, *, expected_size: int | None, token: str | None,
              headers: Mapping[str, str] | None, timeout: float, chunk_size: int,
              progress: Callable[[int], None] | None = None) -> None:
    """One request: append to `part` until the body ends. Raises _Interrupted / _RetryLater / DownloadError."""
    shown = _safe_url(url)
    offset = part.stat().st_size if part.exists() else 0
    if expected_size is not None and offset > expected_size:
        # Longer than the file can be: it is not a prefix of it.
        part.unlink()
        offset = 0
    if expected_size is not None and offset == expected_size and offset > 0:
        return

    req = urllib.request.Request(url, method="GET")
    req.add_header("User-Agent", "mlrepro-data/1")
    req.add_header("Accept-Encoding", "identity")  # byte offsets must mean file offsets
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if offset:
        req.add_header("Range", f"bytes={offset}-")

    try:
        resp = _opener.open(req, timeout=timeout)
    # Errors are not chained: the HTTP error carries the URL, and signed URLs hold credentials.
    except urllib.error.HTTPError as err:
        with err:
            if err.code == 416 and offset:
                # Nothing beyond `offset`: the partial file is already complete,
                # unless the server's total says otherwise.
                total = _content_range_total(err.headers.get("Content-Range"))
                if total is None or total == offset:
                    return
                part.unlink()
                raise _RetryLater(f"server says the file has {total} bytes, local part has {offset}", 0.0) from None
            if err.code in _RETRY_STATUS:
                raise _RetryLater(f"HTTP {err.code} {err.reason}", _retry_after(err.headers.get("Retry-After"))) from None
            if err.code in (401, 403):
                raise DownloadError(
                    f"download of {shown} refused: HTTP {err.code} {err.reason}. The source needs a valid "
                    f"token with access to it{'' if token else ', and none was given'}.") from None
            raise DownloadError(f"download of {shown} failed: HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, (ConnectionError, socket.timeout, TimeoutError, OSError)):
            raise _RetryLater(f"connection failed: {err.reason}", None) from None
        raise DownloadError(f"download of {shown} failed: {err.reason}") from None
    except _CONNECTION_ERRORS as err:
        raise _RetryLater(f"connection failed: {err!r}", None) from None

    with resp:
        if resp.status == 206:
            start = _content_range_start(resp.headers.get("Content-Range"))
            if start != offset:
                part.unlink(missing_ok=True)
                raise _RetryLater(f"server answered range from {start}, asked from {offset}", 0.0)
            mode = "ab"
        else:
            # 200: the server ignored the Range header; start over.
            mode = "wb"
            offset = 0
        length = resp.headers.get("Content-Length")
        want = int(length) if length and length.isdigit() else None
        got = 0
        try:
            with open(part, mode) as out:
                while block := resp.read(chunk_size):
                    out.write(block)
                    got += len(block)
                    if progress is not None:
                        progress(len(block))
        except _CONNECTION_ERRORS as err:
            if got:
                raise _Interrupted(f"{err.__class__.__name__} after {offset + got:,} bytes") from None
            raise _RetryLater(f"connection dropped: {err!r}", None) from None
        # http.client returns b"" rather than raising when a body ends short.
        if want is not None and got < want:
            if got:
                raise _Interrupted(f"connection closed after {offset + got:,} bytes")
            raise _RetryLater("connection closed before any data", None)


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _content_range_start(value: str | None) -> int | None:
    m = _CONTENT_RANGE.match(value or "")
    return int(m.group(1)) if m else None


def _content_range_total(value: str | None) -> int | None:
    m = re.match(r"bytes\s+(?:\d+-\d+|\*)/(\d+)", value or "")
    return int(m.group(1)) if m else None
