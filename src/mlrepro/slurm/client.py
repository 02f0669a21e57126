"""A thin client over the real Slurm commands (sbatch, sacct, squeue, scancel).

Seeds are submitted the way NVIDIA's run.sub expects: the implementation's batch
script goes to sbatch as is, and its settings travel in the environment
(`--export=ALL`), never on the command line. Job state comes from slurmctld
(scontrol) while it holds the job, then from sacct (Slurm's accounting, which
keeps finished jobs for good); see `job_info` for why in that order.

Environment values whose names look secret (HF_TOKEN, ...) are never logged:
every command line or environment that reaches a log goes through mlrepro.util.secrets.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from mlrepro.slurm.records import (  # noqa: F401 (the client's names for what Slurm says)
    CANCELLED,
    COMPLETED,
    FAILED,
    JobInfo,
    NODE_FAIL,
    OUT_OF_MEMORY,
    PENDING,
    PREEMPTED,
    RUNNING,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    STATES,
    SlurmError,
    TERMINAL_STATES,
    TIMEOUT,
    UNKNOWN,
    expand_hostlist,
    is_terminal,
    normalize_state,
    parse_duration,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
)
from mlrepro.util.secrets import redact, redact_command, redact_env
from mlrepro.util.proc import run

log = logging.getLogger("mlrepro.slurm.client")

COMMAND_TIMEOUT_S = 60


def _child_env(env: Mapping[str, object] | None = None) -> dict[str, str]:
    # Job-context variables of a surrounding allocation (SLURM_JOB_ID, ...) would
    # leak into a job submitted from inside one; SLURM_CONF says where the
    # cluster is and must stay.
    child = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    for k, v in (env or {}).items():
        child[str(k)] = str(v)
    return child


def _run(command: list[str], env: Mapping[str, object] | None = None, *, check: bool = True,
         timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """A Slurm command (util.proc.run) in the environment `_child_env` makes; failures raise SlurmError."""
    return run(command, error=SlurmError, env=_child_env(env), check=check, timeout=timeout,
               not_installed=f"{command[0]} not found: Slurm's commands are not installed here "
                             "(`mlrepro cluster up` starts a local cluster)")


# ---------------------------------------------------------------- submit


# sbatch's options a request sets, in the order they stand on the line (before its extra arguments).
_OPTIONS = (("job_name", "--job-name"), ("nodes", "--nodes"), ("time_minutes", "--time"),
            ("partition", "--partition"), ("account", "--account"), ("exclude", "--exclude"),
            ("output", "--output"), ("workdir", "--chdir"), ("signal", "--signal"))
# Always on the line: the job's settings travel in the environment (--export=ALL), as run.sub expects;
# --no-requeue: mlrepro retries a failed seed itself, as a new attempt in its own folder and away from
# the nodes it failed on. A job Slurm requeued after NODE_FAIL would instead run again into the same
# folder (its first run's log beside the second: one seed, two runs).
_FIXED = ("--parsable", "--export=ALL", "--no-requeue")


@dataclasses.dataclass(frozen=True)
class SbatchRequest:
    """One sbatch submission as fields: a seed's plan holds one, and each attempt replaces the fields
    that are its own (dataclasses.replace: exclude, output, workdir); `render` is the command line.

    Settings for the job travel in the environment (--export=ALL), as run.sub expects, so they are
    not part of the request.
    """

    script: str
    nodes: int | None = None
    time_minutes: float | None = None
    partition: str | None = None
    account: str | None = None
    exclude: tuple[str, ...] = ()
    job_name: str | None = None
    output: str | None = None
    workdir: str | None = None
    signal: str | None = None  # --signal, e.g. "B:USR1@120" (none by default)
    extra_args: tuple[str, ...] = ()  # sbatch options that have no field (an array's --array, --wait, ...)
    script_args: tuple[str, ...] = ()

    def __post_init__(self):
        if self.nodes is not None and int(self.nodes) < 1:
            raise ValueError(f"nodes must be at least 1, not {self.nodes}")
        if self.time_minutes is not None and self.time_minutes <= 0:
            raise ValueError(f"time_minutes must be positive, not {self.time_minutes}")
        # Paths and lists are kept as the strings and tuples the line and plan.json hold: a request
        # read back from plan.json is then equal to the one that was written.
        normal = {"script": str(self.script), "exclude": tuple(sorted({str(n) for n in self.exclude if str(n).strip()})),
                  "extra_args": tuple(str(a) for a in self.extra_args),
                  "script_args": tuple(str(a) for a in self.script_args)}
        normal |= {key: str(getattr(self, key)) for key in ("output", "workdir") if getattr(self, key) is not None}
        for key, value in normal.items():
            object.__setattr__(self, key, value)

    def _value(self, field: str) -> str | None:
        value = getattr(self, field)
        if field == "nodes":
            return None if value is None else str(int(value))
        if field == "time_minutes":
            return None if value is None else str(math.ceil(value))
        if field == "exclude":
            return ",".join(value) or None
        return value or None

    def render(self) -> list[str]:
        """The sbatch command line (run as is by `submit_request`)."""
        command = ["sbatch", *_FIXED]
        for field, option in _OPTIONS:
            if (value := self._value(field)) is not None:
                command.append(f"{option}={value}")
        return [*command, *self.extra_args, self.script, *self.script_args]

    def to_json(self) -> dict:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, record: dict | Sequence[str]) -> SbatchRequest:
        """A request as `to_json` wrote it, or a rendered line (what plan.json held before requests)."""
        if not isinstance(record, dict):
            return cls.from_argv(record)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items() if k in names})

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> SbatchRequest:
        """The request a rendered line came from (options without a field are kept as extra_args)."""
        argv = [str(a) for a in argv]
        if argv[:1] != ["sbatch"]:
            raise ValueError(f"not an sbatch line: {argv[:3]}")
        fields = dict((option, field) for field, option in _OPTIONS)
        found: dict = {"extra_args": []}
        at = 1
        while at < len(argv) and argv[at].startswith("-"):
            option, _, value = argv[at].partition("=")
            field = fields.get(option)
            if field in ("nodes", "time_minutes"):
                found[field] = int(value)
            elif field == "exclude":
                found[field] = tuple(value.split(","))
            elif field is not None:
                found[field] = value
            elif argv[at] not in _FIXED:
                found["extra_args"].append(argv[at])
            at += 1
        if at == len(argv):
            raise ValueError(f"an sbatch line without its batch script: {argv}")
        return cls(script=argv[at], script_args=tuple(argv[at + 1:]), **found)


def run_waiting(request: SbatchRequest, *, timeout: float) -> subprocess.CompletedProcess:
    """An sbatch request with --wait, run to its end: its exit status and output are the caller's to
    judge (a job array's tasks are checked by their outputs, not by sbatch's status)."""
    return _run(request.render(), check=False, timeout=timeout)


def submit(batch_script: str | os.PathLike, *, env: Mapping[str, object] | None = None, **options) -> str:
    """Submit `batch_script` with sbatch and return the job id (`options`: the fields of SbatchRequest).

    `env` is added to this process's environment and exported to the job; a
    refusal (bad partition, too many nodes, ...) raises SlurmError with Slurm's
    message.
    """
    return submit_request(SbatchRequest(script=batch_script, **options), env=env)


def submit_request(request: SbatchRequest, *, env: Mapping[str, object] | None = None) -> str:
    """Run the request's sbatch line and return the job id (see `submit`)."""
    command = request.render()
    what = request.job_name or request.script
    if not Path(request.script).is_file():
        raise SlurmError(f"batch script {request.script} does not exist")
    log.info("submitting: %s", " ".join(redact_command(command, _child_env(env))))
    if env:
        log.debug("job environment: %s", redact_env(env))
    try:
        proc = _run(command, env)
    except SlurmError as exc:
        raise SlurmError(f"sbatch refused {what}: {exc.stderr or exc}",
                         command=exc.command, stderr=exc.stderr) from None
    job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if not job_id.split("_")[0].isdigit():
        raise SlurmError(f"sbatch printed no job id: {redact(proc.stdout + proc.stderr, env=_child_env(env))!r}",
                         command=redact_command(command, _child_env(env)))
    log.info("submitted %s as Slurm job %s", what, job_id)
    return job_id


# ---------------------------------------------------------------- query


def _sacct_jobs(args: list[str]) -> list[JobInfo]:
    proc = _run(["sacct", "-X", "-P", "-n", "-o", ",".join(SACCT_FIELDS), *args])
    return parse_sacct(proc.stdout)


def _squeue_jobs(args: list[str]) -> list[JobInfo]:
    proc = _run(["squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT, *args], check=False)
    if proc.returncode != 0:
        # squeue answers "Invalid job id specified" for jobs it has forgotten.
        if "invalid job id" in proc.stderr.lower():
            return []
        raise SlurmError(f"squeue failed (exit {proc.returncode}): {proc.stderr.strip()}", stderr=proc.stderr)
    return parse_squeue(proc.stdout)




def _scontrol_job(job_id: str) -> JobInfo | None:
    proc = _run(["scontrol", "show", "job", "-o", job_id], check=False)
    if proc.returncode != 0:
        # "Invalid job id specified": slurmctld has forgotten the job (MinJobAge) or never had it.
        if "invalid job id" in (proc.stderr + proc.stdout).lower():
            return None
        raise SlurmError(f"scontrol failed (exit {proc.returncode}): {proc.stderr.strip()}", stderr=proc.stderr)
    info = parse_scontrol_job(proc.stdout)
    return info if info is not None and info.job_id == job_id else None


def job_info(job_id: str | int, *, status_command: str = "sacct") -> JobInfo:
    """The current state of Slurm job `job_id`.

    slurmctld (scontrol) answers while it still holds the job: it is the live
    record. Accounting lags behind it (a short job may read PENDING in sacct
    for its whole run, and right at its end sacct can hold a provisional record
    named "allocation" with part of the nodes), so sacct answers only for jobs
    slurmctld has forgotten (MinJobAge after their end) or when slurmctld cannot
    be reached. With status_command="squeue" (clusters without accounting) only
    slurmctld is asked. A job neither knows is UNKNOWN.
    """
    job_id = str(job_id).strip()
    if not job_id:
        raise ValueError("empty Slurm job id")
    if status_command not in ("sacct", "squeue"):
        raise ValueError(f"status_command must be sacct or squeue, not {status_command!r}")
    ctld_error = None
    try:
        ctld = _scontrol_job(job_id)
        if ctld is not None:
            return ctld
    except SlurmError as exc:
        if status_command == "squeue":
            raise
        ctld_error = exc
    sacct_error = None
    if status_command == "sacct":
        try:
            rows = [j for j in _sacct_jobs(["-j", job_id]) if j.job_id == job_id]
        except SlurmError as exc:
            sacct_error, rows = exc, []
        if rows and (rows[-1].terminal or ctld_error is not None):
            return rows[-1]
        if rows:
            return _runaway(rows[-1])
    errors = [str(e) for e in (ctld_error, sacct_error) if e is not None]
    if errors:
        log.warning("Slurm could not say what became of job %s: %s", job_id, "; ".join(errors))
    return JobInfo(job_id=job_id, state=UNKNOWN, source="none", reason="; ".join(errors) or None)


def _runaway(record: JobInfo) -> JobInfo:
    """A job accounting still calls queued or running but slurmctld no longer holds: a "runaway" record
    (slurmctld lost its state, or its end never reached slurmdbd; `sacctmgr show runawayjobs` lists them).
    slurmctld forgets only jobs that ended, so nothing runs there: it is UNKNOWN, never waited on."""
    reason = (f"accounting says {record.state} but slurmctld no longer holds the job "
              "(a runaway record: see `sacctmgr show runawayjobs`)")
    log.warning("Slurm job %s: %s", record.job_id, reason)
    return dataclasses.replace(record, state=UNKNOWN, reason=reason)


def wait(
    job_id: str | int,
    poll_seconds: float = 2.0,
    on_state: Callable[[JobInfo], None] | None = None,
    *,
    status_command: str = "sacct",
    timeout_seconds: float | None = None,
    unknown_grace_seconds: float = 120.0,
    stop: Callable[[], bool] | None = None,
) -> JobInfo:
    """Poll until job `job_id` reaches a terminal state and return its JobInfo.

    `on_state` is called whenever the state changes; once `stop()` says True the job is
    cancelled (once) and waited for to its end. A job that Slurm still does
    not know after `unknown_grace_seconds` raises SlurmError (a wrong id, or a
    cluster that lost it), as does `timeout_seconds` running out.
    """
    started = time.monotonic()
    last_state = None
    cancelled = False
    while True:
        info = job_info(job_id, status_command=status_command)
        if info.state != last_state:
            last_state = info.state
            if on_state is not None:
                on_state(info)
        if info.terminal:
            return info
        if stop is not None and not cancelled and stop():
            cancel(job_id)
            cancelled = True
        waited = time.monotonic() - started
        if info.state == UNKNOWN and waited > unknown_grace_seconds:
            raise SlurmError(f"Slurm does not know job {job_id} (waited {waited:.0f} s)"
                             + (f": {info.reason}" if info.reason else ""))
        if timeout_seconds is not None and waited > timeout_seconds:
            raise SlurmError(f"job {job_id} still {info.state} after {waited:.0f} s")
        time.sleep(poll_seconds)


def accounting(job_id: str | int, *, settle_seconds: float = 30.0) -> JobInfo | None:
    """sacct's own record of a job that has ended (elapsed, nodes, state), waited for while accounting
    still holds a provisional one; None when sacct cannot say (no accounting)."""
    deadline = time.monotonic() + settle_seconds
    while True:
        try:
            rows = [j for j in _sacct_jobs(["-j", str(job_id)]) if j.job_id == str(job_id)]
        except SlurmError:
            return None
        if rows and rows[-1].terminal and rows[-1].elapsed_seconds is not None:
            return rows[-1]
        if time.monotonic() > deadline:
            return rows[-1] if rows else None
        time.sleep(1)


def cancel(job_id: str | int, *, signal: str | None = None) -> None:
    """scancel the job (or send it `signal`, e.g. "USR1", without cancelling)."""
    command = ["scancel"]
    if signal:
        command.append(f"--signal={signal}")
    command.append(str(job_id))
    log.info("cancelling Slurm job %s", job_id)
    _run(command)


def live_jobs_in(folder: str | os.PathLike, *, submitted_since: str = "") -> list[str]:
    """Ids of the current user's queued or running jobs whose working folder is `folder`, submitted
    at or after `submitted_since` (squeue's ISO time, e.g. 2026-11-26T22:41:45)."""
    root = Path(folder).resolve()
    return [job_id for job_id, submitted, workdir in _own_jobs("%i|%V|%Z")
            if job_id and workdir and submitted >= submitted_since and Path(workdir) == root]


def _own_jobs(fields: str, *options: str) -> list[list[str]]:
    """The current user's jobs as squeue lists them, one row of `fields` ("%i|%Z": '|'-separated, the
    last may hold a '|') per job."""
    proc = _run(["squeue", "-h", "-u", _current_user(), *options, "-o", fields], check=False)
    if proc.returncode != 0:
        raise SlurmError(f"squeue failed (exit {proc.returncode}): {proc.stderr.strip()}", stderr=proc.stderr)
    n = fields.count("|") + 1
    return [(row + [""] * n)[:n] for row in (line.strip().split("|", n - 1) for line in proc.stdout.splitlines())
            if row and row[0]]


def _partition_nodes(partition: str) -> list[str] | None:
    """The nodes of a partition as sinfo names them; None if sinfo cannot say."""
    proc = _run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], check=False)
    return sorted(set(proc.stdout.split())) if proc.returncode == 0 and proc.stdout.strip() else None


# sinfo's %T states in which Slurm has taken a node out of service itself; a trailing "*" marks a
# node that does not respond, whatever its state.
OUT_OF_SERVICE = ("down", "drained", "draining", "fail", "failing")


def out_of_service(nodes: Sequence[str]) -> dict[str, str] | None:
    """Which of `nodes` Slurm has taken out of service (down, drained or draining, failing, not
    responding), each with its state and reason as sinfo gives them; None if sinfo cannot say."""
    if not nodes:
        return {}
    proc = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"], check=False)
    return parse_out_of_service(proc.stdout) if proc.returncode == 0 else None


def parse_out_of_service(text: str) -> dict[str, str]:
    """out_of_service from sinfo's `%N|%T|%E` lines (a node is listed once per partition it is in)."""
    found = {}
    for line in text.splitlines():
        name, state, reason = (line.strip().split("|", 2) + ["", ""])[:3]
        base = state.rstrip("*~#!%$@^-+").lower()
        if name and (base in OUT_OF_SERVICE or state.endswith("*")):
            found[name] = state + (f" ({reason})" if reason and reason != "none" else "")
    return found


def exclude_from_pending(folder: str | os.PathLike, nodes: Iterable[str]) -> list[str]:
    """Add `nodes` to the excluded nodes of the current user's pending jobs whose working folder is
    inside `folder` (a reproduction's seeds, queued before a node was found bad): their own
    exclusions are kept. The ids of the jobs updated; a job that started meanwhile is left as it is,
    and so is one that would then need more nodes than its partition has left (Slurm would keep it
    pending for ever, BadConstraints; sbatch refuses such a job, and the seed is submitted without)."""
    nodes = [n for n in nodes if n]
    root = Path(folder).resolve()
    updated, partitions = [], {}
    for job_id, count, partition, excluded, workdir in _own_jobs("%i|%D|%P|%x|%Z", "-t", "PENDING"):
        if not workdir or not Path(workdir).is_relative_to(root):
            continue
        have = expand_hostlist(excluded) if excluded.strip() not in ("", "(null)") else []
        if all(n in have for n in nodes):
            continue
        wanted = [*have, *(n for n in nodes if n not in have)]
        if partition not in partitions:
            partitions[partition] = _partition_nodes(partition)
        left = None if partitions[partition] is None else [n for n in partitions[partition] if n not in wanted]
        if left is not None and count.strip().isdigit() and len(left) < int(count):
            log.warning("Slurm job %s needs %s node(s): excluding %s would leave %d in partition %s; left as it is",
                        job_id, count.strip(), ",".join(wanted), len(left), partition)
            continue
        update = _run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(wanted)}"], check=False)
        if update.returncode == 0:
            updated.append(job_id)
        else:  # started or ended since squeue answered: its nodes are chosen already
            log.info("Slurm job %s not updated: %s", job_id, update.stderr.strip())
    return updated


def find_jobs(name: str, *, user: str | None = None, since: str = "now-30days",
              status_command: str = "sacct") -> list[JobInfo]:
    """Jobs of `user` (default: the current one) named `name`, oldest first.

    For re-attaching to seeds a killed workflow left queued or running: both
    squeue (jobs slurmctld still holds) and sacct (finished ones) are asked.
    For a job both know, sacct's answer wins once it says the job ended (its
    exit code); before that squeue's, since accounting trails the controller
    (sacct can still say PENDING for a job squeue already shows RUNNING). A job
    only sacct knows and calls live is a runaway record, left out.
    """
    if not name:
        raise ValueError("find_jobs needs a job name")
    user = user or _current_user()
    found: dict[str, JobInfo] = {}
    for job in _squeue_jobs(["-n", name, "-u", user]):
        if job.name == name:
            found[job.job_id] = job
    if status_command == "sacct":
        try:
            for job in _sacct_jobs(["--name", name, "-u", user, "-S", since]):
                if job.name != name:
                    continue
                if job.terminal:
                    found[job.job_id] = job
                elif job.job_id not in found:
                    _runaway(job)  # named in the log, left out: nothing of it is queued or running
        except SlurmError as exc:
            log.warning("sacct failed while looking for jobs named %s: %s", name, exc)
    return sorted(found.values(), key=lambda j: _job_sort_key(j.job_id))


def _job_sort_key(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0]
    return (int(head) if head.isdigit() else -1, job_id)


def _current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", str(os.getuid()))
