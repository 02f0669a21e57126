"""A real Slurm cluster on this one machine: `mlrepro cluster up | down | status`.

`up` (as root, on Debian) installs what is missing (slurmctld, slurmd, slurmdbd,
slurm-client, munge, mariadb-server), writes every generated file into a state
folder and starts, without systemd: munged, a private MariaDB, slurmdbd,
slurmctld and two slurmd ("node1", "node2") that each declare 8 CPUs and 4 GPUs
(GRES backed by plain files). Clients find the cluster through
/etc/slurm/slurm.conf, a symlink into the state folder, so sbatch, sacct and
squeue work from any shell, and so do tools that call them (the Snakemake Slurm
executor plugin, submitit).

`up` is idempotent: daemons that already run are left alone and a second `up`
only checks that the nodes are idle and accounting answers. `down` stops only
the daemons that `up` started (their pids are recorded in the state folder) and
puts back any /etc/slurm file it replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mlrepro.util.fsutil import atomic_write_json, atomic_write_text
from mlrepro.util import proc

DEFAULT_STATE_DIR = Path("/var/lib/mlrepro-cluster")
SLURM_ETC = Path("/etc/slurm")
CLUSTER_NAME = "mlrepro"
ACCOUNT = "mlrepro"
PARTITION = "debug"
NODES = {"node1": 17001, "node2": 17002}
CPUS_PER_NODE = 8
GPUS_PER_NODE = 4
# Memory is not a consumable resource here (CR_Core); the figure only has to be
# plausible, and config_overrides lets it exceed what a small CI machine has.
MEMORY_MB_PER_NODE = 8000
SLURMCTLD_PORT = 6817
SLURMDBD_PORT = 6819
# A private MariaDB on its own port and data folder, so a MariaDB the machine
# already runs is neither used nor disturbed.
MARIADB_PORT = 17306
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"

# command that must exist -> Debian package that provides it
REQUIRED_COMMANDS = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "sbatch": "slurm-client",
    "sacctmgr": "slurm-client",
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-client",
}
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")

# Start order; `down` goes the other way.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-node1", "slurmd-node2")


class ClusterError(RuntimeError):
    """A step of bringing the cluster up or down failed; the message says which and why."""


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def state_dir_from_env() -> Path:
    return Path(os.environ.get("MLREPRO_CLUSTER_DIR") or DEFAULT_STATE_DIR)


def find_command(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN_DIRS:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def daemon_env(layout: "Layout") -> dict[str, str]:
    """Environment for daemons and admin commands: our config, no job context.

    SLURM_* variables inherited from a surrounding job (or a user's shell) would
    otherwise change how the daemons and sacctmgr behave.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
    env["SLURM_CONF"] = str(layout.slurm_conf)
    path = env.get("PATH", "")
    for d in SBIN_DIRS:
        if d not in path.split(":"):
            path = f"{path}:{d}" if path else d
    env["PATH"] = path
    return env


@dataclass(frozen=True)
class Layout:
    """Where `up` keeps everything it generates."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def gpus(self) -> Path:
        return self.root / "gpus"

    @property
    def mariadb_data(self) -> Path:
        return self.root / "mariadb"

    @property
    def mariadb_socket(self) -> Path:
        return self.run / "mariadb.sock"

    @property
    def db_password_file(self) -> Path:
        return self.etc / "db_password"

    @property
    def started_file(self) -> Path:
        return self.run / "started.json"

    @property
    def etc_backup(self) -> Path:
        return self.root / "etc-backup"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    def pid_file(self, daemon: str) -> Path:
        if daemon == "munged":
            # munged runs as the munge user and writes its pid file where
            # Debian's package lets it: beside its socket.
            return Path("/run/munge/munged.pid")
        return self.run / f"{daemon}.pid"


# ---------------------------------------------------------------- config text


def slurm_conf_text(layout: Layout, host: str) -> str:
    lines = [
        "# Generated by `mlrepro cluster up`; edits are overwritten on the next `up`.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={layout.spool}/slurmctld",
        f"SlurmdSpoolDir={layout.spool}/slurmd-%n",
        f"SlurmctldPidFile={layout.pid_file('slurmctld')}",
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.logs}/slurmctld.log",
        f"SlurmdLogFile={layout.logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups: they need systemd or a writable cgroup tree, neither of
        # which a container or a CI runner is sure to have.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        # Two slurmd share one host; the nodes declare what the config says.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        # Short timers so that a job starts within a second or two of sbatch.
        "SchedulerParameters=sched_interval=2,bf_interval=2,sched_min_interval=100000",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={SLURMDBD_PORT}",
        "AccountingStorageTRES=gres/gpu",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
        "JobCompType=jobcomp/none",
        # Finished jobs stay in slurmctld's memory for 5 minutes (squeue and
        # scontrol see them); sacct keeps them for good.
        "MinJobAge=300",
        "KillWait=5",
        "OverTimeLimit=0",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=120",
        "MessageTimeout=20",
        "Waittime=0",
    ]
    for name, port in NODES.items():
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} Boards=1 SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} "
            f"ThreadsPerCore=1 RealMemory={MEMORY_MB_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES "
        "MaxTime=INFINITE DefaultTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def gres_conf_text(layout: Layout) -> str:
    lines = ["# Generated by `mlrepro cluster up`: GPUs are plain files, nothing is probed.", "AutoDetect=off"]
    for name in NODES:
        lines.append(
            f"NodeName={name} Name=gpu File={layout.gpus}/{name}/gpu[0-{GPUS_PER_NODE - 1}]"
        )
    return "\n".join(lines) + "\n"


def slurmdbd_conf_text(layout: Layout, db_password: str) -> str:
    return "\n".join(
        [
            "# Generated by `mlrepro cluster up`.",
            "AuthType=auth/munge",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={SLURMDBD_PORT}",
            "SlurmUser=root",
            f"LogFile={layout.logs}/slurmdbd.log",
            f"PidFile={layout.pid_file('slurmdbd')}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={MARIADB_PORT}",
            f"StorageUser={DB_USER}",
            f"StoragePass={db_password}",
            f"StorageLoc={DB_NAME}",
        ]
    ) + "\n"


# ---------------------------------------------------------------- processes


def _run(cmd: list[str], layout: Layout | None = None, *, check: bool = True, timeout: float = 120,
         input_text: str | None = None) -> subprocess.CompletedProcess:
    """A command (util.proc.run) in the daemons' environment; failures raise ClusterError."""
    return proc.run(cmd, error=ClusterError, env=daemon_env(layout) if layout else None, check=check, timeout=timeout,
               input_text=input_text)


def _start_detached(cmd: list[str], layout: Layout, log_file: Path) -> subprocess.Popen:
    """Start a daemon in its own session with no pipes back to us.

    A daemon that inherited our stdout would keep a caller that captures our
    output (a test fixture, CI) waiting forever.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=daemon_env(layout), start_new_session=True, close_fds=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has not reaped it yet.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _expected_comm(daemon: str) -> str:
    return "slurmd" if daemon.startswith("slurmd-") else daemon


def running_pid(layout: Layout, daemon: str) -> int | None:
    """The pid of our `daemon` if its pid file names a live process of that program."""
    pid = read_pid(layout.pid_file(daemon))
    if pid and pid_alive(pid) and _process_name(pid).startswith(_expected_comm(daemon)[:15]):
        return pid
    return None


def _load_started(layout: Layout) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(layout.started_file.read_text()).items()}
    except (OSError, ValueError):
        return {}


def _record_started(layout: Layout, daemon: str, pid: int) -> None:
    started = _load_started(layout)
    started[daemon] = pid
    atomic_write_json(layout.started_file, started)


def _forget_started(layout: Layout, daemon: str) -> None:
    started = _load_started(layout)
    if started.pop(daemon, None) is not None:
        atomic_write_json(layout.started_file, started)


def _wait_for(what: str, check, timeout: float, interval: float = 0.5, log_hint: Path | None = None):
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = check()
            if result:
                return result
        except ClusterError as exc:
            last_error = str(exc)
        if time.monotonic() > deadline:
            hint = f"; see {log_hint}" if log_hint else ""
            detail = f" (last error: {last_error})" if last_error else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{detail}{hint}")
        time.sleep(interval)


def _wait_for_pid_file(layout: Layout, daemon: str, timeout: float, log_hint: Path) -> int:
    return _wait_for(f"{daemon} to start", lambda: running_pid(layout, daemon), timeout, log_hint=log_hint)


# ---------------------------------------------------------------- install


def missing_packages() -> list[str]:
    packages: list[str] = []
    for command, package in REQUIRED_COMMANDS.items():
        if find_command(command) is None and package not in packages:
            packages.append(package)
    # slurmdbd talks to MariaDB through this plugin; it comes with slurmdbd, but
    # a half-removed install may lack it.
    return packages


def install_packages(packages: list[str]) -> None:
    log(f"installing {' '.join(packages)} with apt-get (once per machine) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Debian's maintainer scripts would start munge, mariadb and slurm with their
    # stock configs; a policy-rc.d that answers 101 keeps them from doing so.
    policy = Path("/usr/sbin/policy-rc.d")
    wrote_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# written by mlrepro cluster up during apt-get install\nexit 101\n")
        policy.chmod(0o755)
        wrote_policy = True
    try:
        for cmd in (
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends",
             "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", *packages],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise ClusterError(f"`{' '.join(cmd[:3])}` failed (exit {proc.returncode}):\n{tail}")
    finally:
        if wrote_policy:
            policy.unlink(missing_ok=True)
    still = missing_packages()
    if still:
        raise ClusterError(f"after apt-get install these are still missing: {', '.join(still)}")


# ---------------------------------------------------------------- files


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    try:
        if path.read_text() == text:
            path.chmod(mode)
            return False
    except OSError:
        pass
    atomic_write_text(path, text)
    path.chmod(mode)
    return True


# Stand-ins for GPU device files: character devices that alias harmless kernel
# devices (null, zero, full, urandom). Slurm wants a device (it reads major and
# minor numbers) before it sets CUDA_VISIBLE_DEVICES for a job's GPUs; a plain
# file also works, minus that variable, where mknod is not allowed.
_GPU_STAND_INS = ((1, 3), (1, 5), (1, 7), (1, 9))


def _make_gpu_file(path: Path, index: int) -> None:
    import stat

    try:
        if stat.S_ISCHR(path.lstat().st_mode):
            return
        path.unlink()
    except FileNotFoundError:
        pass
    major, minor = _GPU_STAND_INS[index % len(_GPU_STAND_INS)]
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except OSError:
        path.touch()


def write_files(layout: Layout, host: str) -> bool:
    """Write configs, folders and GPU files; True if slurm.conf or gres.conf changed."""
    for d in (layout.etc, layout.run, layout.logs, layout.spool / "slurmctld", layout.munge_dir):
        d.mkdir(parents=True, exist_ok=True)
    layout.root.chmod(0o755)
    for name in NODES:
        (layout.spool / f"slurmd-{name}").mkdir(parents=True, exist_ok=True)
        gpu_dir = layout.gpus / name
        gpu_dir.mkdir(parents=True, exist_ok=True)
        for i in range(GPUS_PER_NODE):
            _make_gpu_file(gpu_dir / f"gpu{i}", i)
    if not layout.db_password_file.exists():
        atomic_write_text(layout.db_password_file, secrets.token_hex(16) + "\n")
    layout.db_password_file.chmod(0o600)
    password = layout.db_password_file.read_text().strip()
    changed = _write_if_changed(layout.slurm_conf, slurm_conf_text(layout, host))
    changed |= _write_if_changed(layout.gres_conf, gres_conf_text(layout))
    # slurmdbd refuses a config that others can read: it holds the DB password.
    _write_if_changed(layout.slurmdbd_conf, slurmdbd_conf_text(layout, password), mode=0o600)
    return changed


def link_etc_slurm(layout: Layout) -> None:
    """Make /etc/slurm/{slurm,gres,slurmdbd}.conf point into the state folder.

    Every Slurm client reads /etc/slurm/slurm.conf unless SLURM_CONF says
    otherwise, so this is what makes plain `sbatch` in any shell reach us. A file
    that is not ours is moved to the state folder and put back by `down`.
    """
    SLURM_ETC.mkdir(parents=True, exist_ok=True)
    for source in (layout.slurm_conf, layout.gres_conf, layout.slurmdbd_conf):
        link = SLURM_ETC / source.name
        if link.is_symlink() and Path(os.readlink(link)) == source:
            continue
        if link.exists() or link.is_symlink():
            layout.etc_backup.mkdir(parents=True, exist_ok=True)
            backup = layout.etc_backup / source.name
            if not backup.exists() and not backup.is_symlink():
                log(f"moving the existing {link} to {backup} (restored by `down`)")
                os.replace(link, backup)
            else:
                link.unlink()
        link.symlink_to(source)


def unlink_etc_slurm(layout: Layout) -> None:
    for name in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
        link = SLURM_ETC / name
        if link.is_symlink() and Path(os.readlink(link)) == layout.etc / name:
            link.unlink()
        backup = layout.etc_backup / name
        if (backup.exists() or backup.is_symlink()) and not (link.exists() or link.is_symlink()):
            os.replace(backup, link)
            log(f"restored {link}")


def ensure_hostname_resolves(host: str) -> None:
    try:
        socket.gethostbyname(host)
        return
    except OSError:
        pass
    log(f"hostname {host!r} does not resolve; adding it to /etc/hosts")
    with open("/etc/hosts", "a") as fh:
        fh.write(f"127.0.1.1 {host}  # added by mlrepro cluster up\n")


# ---------------------------------------------------------------- daemons


def _munge_answers(layout: Layout) -> bool:
    munge, unmunge = find_command("munge"), find_command("unmunge")
    if not (munge and unmunge):
        return False
    cred = subprocess.run([munge, "-n"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if cred.returncode != 0:
        return False
    check = subprocess.run([unmunge], input=cred.stdout, capture_output=True, text=True)
    return check.returncode == 0


def start_munged(layout: Layout) -> None:
    if running_pid(layout, "munged") or _munge_answers(layout):
        return  # ours, or a munged the machine already runs: either serves us
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        mungekey = find_command("mungekey")
        if mungekey:
            _run([mungekey, "--create", f"--keyfile={key}"])
        else:
            key.write_bytes(secrets.token_bytes(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    # munged runs as the munge user that Debian's package created; the socket
    # stays where every client looks for it (/run/munge).
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    run_dir.chmod(0o755)
    for d in ("/var/lib/munge", "/var/log/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    layout.pid_file("munged").unlink(missing_ok=True)
    log_file = Path("/var/log/munge/munged.log")
    # --force: a socket left behind by a munged that was killed would otherwise stop it.
    _run(["runuser", "-u", "munge", "--", find_command("munged") or "munged", "--force"], layout)
    pid = _wait_for_pid_file(layout, "munged", 20, log_file)
    _wait_for("munge to answer", lambda: _munge_answers(layout), 20)
    _record_started(layout, "munged", pid)


def _mariadb(layout: Layout, sql: str) -> str:
    return _run(["mariadb", "--no-defaults", f"--socket={layout.mariadb_socket}", "-uroot", "-N", "-B",
                 "-e", sql], layout).stdout


def start_mariadb(layout: Layout) -> None:
    if not running_pid(layout, "mariadbd"):
        if not (layout.mariadb_data / "mysql").is_dir():
            log("creating the accounting database files ...")
            _run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={layout.mariadb_data}",
                  "--auth-root-authentication-method=socket", "--skip-test-db"], layout, timeout=300)
        log_file = layout.logs / "mariadb.log"
        _start_detached(
            [find_command("mariadbd") or "mariadbd", "--no-defaults", "--user=root",
             f"--datadir={layout.mariadb_data}", f"--socket={layout.mariadb_socket}",
             f"--port={MARIADB_PORT}", "--bind-address=127.0.0.1",
             f"--pid-file={layout.pid_file('mariadbd')}", f"--log-error={log_file}",
             "--skip-log-bin", "--innodb-buffer-pool-size=64M", "--innodb-lock-wait-timeout=900",
             # A test cluster's accounting need not survive a power cut: no fsync per commit, so
             # sacct (which the executor plugin polls) does not trail the jobs on a slow disk.
             "--innodb-flush-log-at-trx-commit=2",
             "--innodb-log-file-size=64M", "--max-connections=100"],
            layout, log_file)
        pid = _wait_for_pid_file(layout, "mariadbd", 60, log_file)
        _record_started(layout, "mariadbd", pid)
        _wait_for("MariaDB to accept connections", lambda: _mariadb(layout, "SELECT 1").strip() == "1", 60,
                  log_hint=log_file)
    password = layout.db_password_file.read_text().strip()
    # IF NOT EXISTS + ALTER keep this idempotent and in step with the stored password.
    statements = [f"CREATE DATABASE IF NOT EXISTS {DB_NAME}"]
    for host in ("localhost", "127.0.0.1"):
        statements += [
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{password}'",
            f"ALTER USER '{DB_USER}'@'{host}' IDENTIFIED BY '{password}'",
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}'",
        ]
    _mariadb(layout, "; ".join(statements) + "; FLUSH PRIVILEGES")


def _sacctmgr(layout: Layout, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["sacctmgr", "-i", *args], layout, check=check, timeout=60)


def _dbd_answers(layout: Layout) -> bool:
    proc = _run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], layout, check=False, timeout=30)
    return proc.returncode == 0


def start_slurmdbd(layout: Layout) -> None:
    if not running_pid(layout, "slurmdbd"):
        layout.pid_file("slurmdbd").unlink(missing_ok=True)
        log_file = layout.logs / "slurmdbd.log"
        _run([find_command("slurmdbd") or "slurmdbd"], layout)
        pid = _wait_for_pid_file(layout, "slurmdbd", 30, log_file)
        _record_started(layout, "slurmdbd", pid)
        _wait_for("slurmdbd to answer", lambda: _dbd_answers(layout), 60, log_hint=log_file)
    # slurmctld registers with slurmdbd only if its cluster is known there.
    clusters = _run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], layout).stdout.split()
    if CLUSTER_NAME not in clusters:
        _sacctmgr(layout, "add", "cluster", CLUSTER_NAME)
    accounts = _run(["sacctmgr", "-n", "-P", "show", "account", "format=account"], layout).stdout.split()
    if ACCOUNT not in accounts:
        _sacctmgr(layout, "add", "account", ACCOUNT, f"Cluster={CLUSTER_NAME}",
                  "Description=mlrepro local cluster", "Organization=mlrepro")
    users = {"root"}
    if os.environ.get("SUDO_USER"):
        users.add(os.environ["SUDO_USER"])
    known = _run(["sacctmgr", "-n", "-P", "show", "assoc", f"cluster={CLUSTER_NAME}", "format=user"],
                 layout).stdout.split()
    for user in sorted(users - set(known)):
        _sacctmgr(layout, "add", "user", user, f"Account={ACCOUNT}", f"Cluster={CLUSTER_NAME}")


def start_slurmctld(layout: Layout) -> None:
    if running_pid(layout, "slurmctld"):
        return
    layout.pid_file("slurmctld").unlink(missing_ok=True)
    log_file = layout.logs / "slurmctld.log"
    _run([find_command("slurmctld") or "slurmctld"], layout)
    pid = _wait_for_pid_file(layout, "slurmctld", 30, log_file)
    _record_started(layout, "slurmctld", pid)
    _wait_for("slurmctld to answer", lambda: _run(["scontrol", "ping"], layout, check=False).returncode == 0,
              30, log_hint=log_file)


def start_slurmd(layout: Layout, node: str) -> None:
    daemon = f"slurmd-{node}"
    if running_pid(layout, daemon):
        return
    layout.pid_file(daemon).unlink(missing_ok=True)
    log_file = layout.logs / f"{daemon}.log"
    _run([find_command("slurmd") or "slurmd", "-N", node], layout)
    pid = _wait_for_pid_file(layout, daemon, 30, log_file)
    _record_started(layout, daemon, pid)


def node_states(layout: Layout) -> dict[str, str]:
    proc = _run(["sinfo", "-h", "-N", "-o", "%N %T"], layout, check=False, timeout=30)
    if proc.returncode != 0:
        raise ClusterError(f"sinfo failed: {proc.stderr.strip()}")
    states = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def wait_until_ready(layout: Layout, timeout: float = 120) -> None:
    resumed = False
    started = time.monotonic()

    def nodes_ready() -> bool:
        nonlocal resumed
        states = node_states(layout)
        usable = ("idle", "mixed", "allocated", "completing")
        if all(states.get(n, "").rstrip("~#*$@") in usable and not states[n].endswith("*") for n in NODES):
            return True
        # A node left DOWN or DRAINED by an earlier unclean stop is put back in
        # service once its slurmd has had time to register.
        bad = [n for n in NODES if states.get(n, "").startswith(("down", "drain"))]
        if bad and not resumed and time.monotonic() - started > 5:
            _run(["scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME"], layout, check=False)
            resumed = True
        return False

    _wait_for("both nodes to be idle", nodes_ready, timeout, log_hint=layout.logs)

    def accounting_ready() -> bool:
        sacct = _run(["sacct", "-n", "-X", "-o", "jobid"], layout, check=False, timeout=30)
        if sacct.returncode != 0:
            return False
        # ControlHost is filled in once slurmctld has registered with slurmdbd:
        # from then on every job is recorded.
        host = _run(["sacctmgr", "-n", "-P", "show", "cluster", CLUSTER_NAME, "format=controlhost"],
                    layout, check=False, timeout=30)
        return host.returncode == 0 and bool(host.stdout.strip())

    _wait_for("accounting (sacct) to answer", accounting_ready, timeout, log_hint=layout.logs / "slurmdbd.log")


def stop_daemon(layout: Layout, daemon: str, timeout: float = 20) -> bool:
    pid = running_pid(layout, daemon)
    started = _load_started(layout)
    if pid is None or started.get(daemon) != pid:
        _forget_started(layout, daemon)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid_alive(pid):
        log(f"{daemon} (pid {pid}) ignored SIGTERM for {timeout:.0f} s; killing it")
        os.kill(pid, signal.SIGKILL)
    _forget_started(layout, daemon)
    return True


# ---------------------------------------------------------------- commands


def cluster_up(layout: Layout, timeout: float = 180) -> None:
    t0 = time.monotonic()
    if os.geteuid() != 0:
        if _all_running(layout):
            wait_until_ready(layout, timeout)
            log("cluster is already up")
            return
        raise ClusterError("`mlrepro cluster up` must run as root: it installs packages and starts daemons")
    packages = missing_packages()
    if packages:
        t_install = time.monotonic()
        install_packages(packages)
        log(f"installed in {time.monotonic() - t_install:.0f} s")
    host = short_hostname()
    ensure_hostname_resolves(host)
    conf_changed = write_files(layout, host)
    link_etc_slurm(layout)
    if conf_changed:
        # Running Slurm daemons would keep the old node and GRES layout.
        for daemon in reversed(DAEMONS[3:]):
            if stop_daemon(layout, daemon):
                log(f"restarted {daemon}: its configuration changed")
    start_munged(layout)
    start_mariadb(layout)
    start_slurmdbd(layout)
    start_slurmctld(layout)
    for node in NODES:
        start_slurmd(layout, node)
    wait_until_ready(layout, timeout)
    log(f"cluster {CLUSTER_NAME!r} is up ({len(NODES)} nodes x {GPUS_PER_NODE} GPUs, partition "
        f"{PARTITION!r}) in {time.monotonic() - t0:.1f} s; config {SLURM_ETC / 'slurm.conf'} -> {layout.slurm_conf}")


def _all_running(layout: Layout) -> bool:
    return all(running_pid(layout, d) for d in DAEMONS if d != "munged") and (
        running_pid(layout, "munged") is not None or _munge_answers(layout))


def cancel_all_jobs(layout: Layout) -> None:
    """scancel every job on the cluster and wait (30 s at most) until none is left."""
    if not running_pid(layout, "slurmctld"):
        return
    jobs = _run(["squeue", "-h", "-o", "%i"], layout, check=False, timeout=30).stdout.split()
    if not jobs:
        return
    log(f"cancelling {len(jobs)} job(s) still on the cluster")
    _run(["scancel", *jobs], layout, check=False, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _run(["squeue", "-h", "-o", "%i"], layout, check=False, timeout=30).stdout.split()
        if not left:
            return
        time.sleep(0.5)


def cluster_down(layout: Layout, purge: bool = False) -> None:
    if os.geteuid() != 0:
        raise ClusterError("`mlrepro cluster down` must run as root")
    cancel_all_jobs(layout)
    stopped = [d for d in reversed(DAEMONS) if stop_daemon(layout, d)]
    unlink_etc_slurm(layout)
    log(f"stopped {', '.join(stopped) if stopped else 'nothing (no daemon started by `up` was running)'}")
    if purge and layout.root.exists():
        shutil.rmtree(layout.root)
        log(f"removed {layout.root}")


def cluster_status(layout: Layout) -> int:
    daemons = {d: running_pid(layout, d) for d in DAEMONS}
    started = _load_started(layout)
    print(f"state folder: {layout.root}")
    for daemon, pid in daemons.items():
        owner = "started by mlrepro" if pid and started.get(daemon) == pid else ""
        if daemon == "munged" and not pid and _munge_answers(layout):
            print(f"  {daemon:14s} running (not started by mlrepro)")
            continue
        print(f"  {daemon:14s} {'running, pid ' + str(pid) if pid else 'not running'} {owner}".rstrip())
    if not find_command("sinfo"):
        print("Slurm is not installed (run `mlrepro cluster up` as root)")
        return 1
    sinfo = _run(["sinfo", "-N", "-o", "%N %P %T %c %m %G"], layout, check=False, timeout=30)
    print(sinfo.stdout.rstrip() if sinfo.returncode == 0 else f"sinfo: {sinfo.stderr.strip()}")
    sacct = _run(["sacct", "-n", "-X", "-o", "jobid"], layout, check=False, timeout=30)
    print(f"accounting (sacct): {'answers' if sacct.returncode == 0 else 'does not answer: ' + sacct.stderr.strip()}")
    return 0 if sinfo.returncode == 0 and sacct.returncode == 0 else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status"),
                        help="up: install (if needed) and start; down: stop what up started; status: show sinfo")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help=f"where generated configs, logs and the database live "
                             f"(default: $MLREPRO_CLUSTER_DIR or {DEFAULT_STATE_DIR})")
    parser.add_argument("--timeout", type=float, default=180,
                        help="seconds `up` waits for the nodes and accounting (default 180)")
    parser.add_argument("--purge", action="store_true",
                        help="with down: also delete the state folder (database included)")


def run(args: argparse.Namespace) -> int:
    layout = Layout((args.state_dir or state_dir_from_env()).resolve())
    try:
        if args.action == "up":
            cluster_up(layout, timeout=args.timeout)
            return 0
        if args.action == "down":
            cluster_down(layout, purge=args.purge)
            return 0
        return cluster_status(layout)
    except ClusterError as exc:
        print(f"mlrepro cluster {args.action}: {exc}", file=sys.stderr)
        return 1
