"""Every process a local seed starts, found and stopped as one.

torch's elastic launcher starts each rank in a session of its own, so killing the run's
process group misses the ranks, and a rank whose parent died is re-parented to init:
neither the group nor the parent chain finds it. What every descendant does keep is its
environment, so the run is started with MARKER=<id of the seed> and the processes that
carry it in /proc/<pid>/environ are the seed's, wherever they were re-parented to.

A watchdog (`python -m mlrepro.util.proctree watch ...`, in a session of its own) stops them
all when the process that owns the seed dies without doing so (SIGKILL of the workflow).

Each attempt carries its own value, <seed>.<attempt>: the seed's marker finds every attempt's
processes (what a new attempt stops first), an attempt's finds only its own. A watchdog holds
its attempt's, so one still at work after its workflow was killed never touches the rerun's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "MLREPRO_SEED_ID"


class Survivors(RuntimeError):
    """Processes of the seed that did not die when killed."""


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks after boot: tells a process from a later one with the same pid
    command: str


def seed_marker(seed_dir: str | os.PathLike) -> str:
    return hashlib.sha1(str(Path(seed_dir).resolve()).encode()).hexdigest()[:16]


def attempt_marker(seed: str, attempt: int) -> str:
    """The marker of one attempt of the seed whose marker is `seed`."""
    return f"{seed}.{attempt}"


def start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the rest follows the last ')'.
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 else None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid and pid not in pids:
        pids.add(pid)
        pid = _parent(pid)
    return pids


def find(marker: str, variable: str = MARKER) -> list[Proc]:
    """The live processes whose environment carries MARKER=marker (or `variable`=marker), or one of
    its attempts' markers (this process and its ancestors excepted)."""
    needle = f"{variable}={marker}".encode()
    attempts = needle + b"."
    mine = _ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        if needle not in env or not any(v == needle or v.startswith(attempts) for v in env.split(b"\0")):
            continue
        started = start_time(int(entry.name))
        if started is None:
            continue
        try:
            command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = ""
        found.append(Proc(int(entry.name), started, command))
    return found


def kill(marker: str, timeout: float = 15.0, variable: str = MARKER) -> list[Proc]:
    """SIGKILL every process of the seed (or of whatever `variable`=marker tags) until none is left;
    the ones killed. Survivors if some will not die."""
    killed: dict[int, Proc] = {}
    deadline = time.monotonic() + timeout
    while True:
        procs = find(marker, variable)
        if not procs:
            return list(killed.values())
        if time.monotonic() > deadline:
            raise Survivors("processes of the seed survive SIGKILL: "
                            + "; ".join(f"{p.pid} {p.command[:80]}" for p in procs))
        for p in procs:
            if start_time(p.pid) == p.start:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                    killed[p.pid] = p
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.1)


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = set()
    while pid and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = _parent(pid) or 0
    return False


def send(marker: str, sig: int, under: int, variable: str = MARKER) -> list[Proc]:
    """Send `sig` once to every live process of the seed that descends from `under` (the run's own
    script: not the launcher processes above it, which the signal would end): a request, such as
    SIGUSR1's "save and stop", that each process answers by its own handler."""
    sent = []
    for p in find(marker, variable):
        if start_time(p.pid) == p.start and _descends_from(p.pid, under):
            try:
                os.kill(p.pid, sig)
                sent.append(p)
            except (ProcessLookupError, PermissionError):
                pass
    return sent


def kill_process(pid: int, start: int | None) -> bool:
    """SIGKILL `pid` if it is still the process that started at `start`."""
    if pid in _ancestors() or start is None or start_time(pid) != start:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def start_watchdog(marker: str, owner: int | None = None) -> subprocess.Popen:
    """A process that kills the seed's processes once `owner` (default: this process) is gone."""
    owner = os.getpid() if owner is None else owner
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    return subprocess.Popen(
        [sys.executable, "-m", "mlrepro.util.proctree", "watch", str(owner), str(start_time(owner)), marker],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def watch(owner: int, owner_start: int, marker: str, poll: float = 0.5) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C of the workflow must not stop the guard
    while start_time(owner) == owner_start:
        time.sleep(poll)
    kill(marker, timeout=60.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlrepro.util.proctree")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch", help="kill the seed's processes once OWNER is gone")
    w.add_argument("owner", type=int)
    w.add_argument("owner_start", type=int)
    w.add_argument("marker")
    args = parser.parse_args(argv)
    watch(args.owner, args.owner_start, args.marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
