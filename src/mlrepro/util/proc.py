"""The one way mlrepro runs a short command: output captured, secrets redacted, failure raised as the caller's error.

Long-running children whose output is a log (download scripts, training runs) stream instead:
see `run_logged`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from mlrepro.util.secrets import redact, redact_command, redactor, secret_values


def run(cmd: Sequence[object], *, error: type[Exception] = RuntimeError, env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None, check: bool = True, timeout: float | None = None,
        input_text: str | None = None, what: str | None = None,
        not_installed: str | None = None, detail_chars: int | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` to completion with its output captured as text.

    `env` is the child's whole environment (None: this process's). A command that cannot start
    (`not_installed`, default "<cmd> is not installed"), runs past `timeout` seconds, or with
    `check` exits non-zero raises `error` naming `what` (default: the program) with the command's
    own words; secrets of the child's environment are redacted from every message. The raised
    error also carries `command` (redacted) and `stderr` (redacted, possibly "") attributes.
    """
    cmd = [str(c) for c in cmd]
    seen_env = os.environ if env is None else env
    shown = redact_command(cmd, seen_env)
    what = what or cmd[0]

    def fail(message: str, stderr: str = "") -> Exception:
        exc = error(message)
        exc.command, exc.stderr = shown, stderr
        return exc

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=None if env is None else dict(env), cwd=cwd,
                              timeout=timeout, input=input_text,
                              stdin=None if input_text is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise fail(not_installed or f"{cmd[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise fail(f"{what} did not finish within {timeout:.0f} s ({' '.join(shown)})") from exc
    if check and proc.returncode != 0:
        detail = redact((proc.stderr or proc.stdout).strip(), env=seen_env)
        if detail_chars is not None:
            detail = detail[-detail_chars:]
        raise fail(f"{what} failed (exit {proc.returncode}): {detail}", detail)
    return proc


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_logged(cmd: Sequence[str], *, env: Mapping[str, str], log_path: str | os.PathLike,
               error: type[Exception] = RuntimeError, cwd: str | os.PathLike | None = None,
               secrets: Iterable[str] = (), what: str | None = None) -> Path:
    """Run `cmd` with `env` added to this process's; its output goes, secrets redacted, to `log_path` (appended).

    For children whose output is a log to follow while they run. A non-zero exit raises `error`
    naming the log and showing its last lines.
    """
    log_path = Path(log_path)
    child_env = {**os.environ, **env}
    hidden = secret_values(child_env) + [s for s in secrets if s]
    what = what or shlex.join(cmd[:2])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    hide = redactor(child_env, hidden)
    with open(log_path, "ab") as out:
        out.write(f"$ {redact(shlex.join(cmd), hidden, env=child_env)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(cmd, env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as err:
            raise error(f"cannot start {shlex.join(cmd[:3])} ...: {err.strerror}") from None
        assert proc.stdout is not None
        # Line by line so the log can be followed while it runs; a token never
        # spans a newline, so per-line replacement catches every occurrence.
        for line in proc.stdout:
            out.write(hide.line_bytes(line))
            out.flush()
        rc = proc.wait()
    if rc != 0:
        raise error(f"{what} failed with exit status {rc}; see {log_path}. "
                    f"Last lines:\n{_log_tail(log_path)}")
    return log_path
