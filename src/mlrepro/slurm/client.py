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
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from mlrepro.util.secrets import redact, redact_command, redact_env
from mlrepro.util.proc import run

log = logging.getLogger("mlrepro.slurm.client")

PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
NODE_FAIL = "NODE_FAIL"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
PREEMPTED = "PREEMPTED"
UNKNOWN = "UNKNOWN"

STATES = (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, UNKNOWN)
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED})

# Slurm's many job states (sacct and squeue spell them alike), folded into ours.
_STATE_MAP = {
    "PENDING": PENDING,
    "REQUEUED": PENDING,
    "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING,
    "RESV_DEL_HOLD": PENDING,
    "SUSPENDED": RUNNING,
    "STOPPED": RUNNING,
    "RUNNING": RUNNING,
    "CONFIGURING": RUNNING,
    "COMPLETING": RUNNING,
    "SIGNALING": RUNNING,
    "STAGE_OUT": RUNNING,
    "RESIZING": RUNNING,
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "SPECIAL_EXIT": FAILED,
    "CANCELLED": CANCELLED,
    "REVOKED": CANCELLED,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
    "NODE_FAIL": NODE_FAIL,
    "BOOT_FAIL": NODE_FAIL,
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "PREEMPTED": PREEMPTED,
}

COMMAND_TIMEOUT_S = 60


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries Slurm's own words."""

    def __init__(self, message: str, *, command: Sequence[str] = (), stderr: str = "") -> None:
        super().__init__(message)
        self.command = list(command)
        self.stderr = stderr


# ---------------------------------------------------------------- job info


@dataclass
class JobInfo:
    job_id: str
    state: str = UNKNOWN
    raw_state: str = ""
    name: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: list[str] = field(default_factory=list)
    elapsed_seconds: int | None = None
    submit: str | None = None
    start: str | None = None
    end: str | None = None
    reason: str | None = None
    source: str = ""  # sacct | squeue | none

    @property
    def terminal(self) -> bool:
        return is_terminal(self.state)

def is_terminal(state: str) -> bool:
    """True once a job can change no more (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
    return normalize_state(state) in TERMINAL_STATES


def normalize_state(raw: str) -> str:
    """Fold a Slurm state ("CANCELLED by 0", "COMPLETING", "BOOT_FAIL", "CD") into STATES."""
    word = (raw or "").strip().split(" ")[0].rstrip("+").upper()
    if word in STATES:
        return word
    return _STATE_MAP.get(word, _SHORT_STATES.get(word, UNKNOWN))


_SHORT_STATES = {
    "PD": PENDING, "R": RUNNING, "CG": RUNNING, "CF": RUNNING, "S": RUNNING, "ST": RUNNING,
    "SO": RUNNING, "SI": RUNNING, "RS": RUNNING, "RQ": PENDING, "RH": PENDING, "RF": PENDING,
    "RD": PENDING, "CD": COMPLETED, "F": FAILED, "SE": FAILED, "CA": CANCELLED, "RV": CANCELLED,
    "TO": TIMEOUT, "DL": TIMEOUT, "NF": NODE_FAIL, "BF": NODE_FAIL, "OOM": OUT_OF_MEMORY, "PR": PREEMPTED,
}


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand Slurm's compressed host list: "gpu[01-03,07],login" -> gpu01 gpu02 gpu03 gpu07 login."""
    hostlist = (hostlist or "").strip()
    if not hostlist or hostlist.lower().startswith(("none", "(null)")):
        return []
    hosts: list[str] = []
    for part in _split_top_level(hostlist):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            choices = [literal]
            if ranges:
                choices = []
                for item in ranges.split(","):
                    lo, _, hi = item.partition("-")
                    if hi:
                        width = len(lo) if lo.startswith("0") else 0
                        choices += [f"{literal}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
                    else:
                        choices.append(f"{literal}{lo}")
            expanded = [e + c for e in expanded for c in choices]
        hosts += [h for h in expanded if h]
    return hosts


def parse_duration(text: str) -> int | None:
    """Slurm's [D-]HH:MM:SS / MM:SS / seconds -> seconds; None when not a duration."""
    text = (text or "").strip()
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?", text)
    if m:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if text.isdigit():
        return int(text)
    return None


def _timestamp(text: str) -> str | None:
    text = (text or "").strip()
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    return text


def _parse_exit(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "NodeList", "ElapsedRaw", "Submit", "Start", "End",
                "Reason", "JobName")


def parse_sacct(text: str) -> list[JobInfo]:
    """Parse `sacct -X -P -n -o` + ",".join(SACCT_FIELDS) output (JobName last: it may hold '|')."""
    jobs = []
    n = len(SACCT_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", n - 1)
        if len(parts) < n:
            raise SlurmError(f"unexpected sacct line (wanted {n} fields): {line!r}")
        job_id, raw_state, exit_text, nodelist, elapsed, submit, start, end, reason, name = parts
        exit_code, sig = _parse_exit(exit_text)
        jobs.append(JobInfo(
            job_id=job_id.strip(),
            state=normalize_state(raw_state),
            raw_state=raw_state.strip(),
            name=name,
            exit_code=exit_code,
            signal=sig,
            nodes=expand_hostlist(nodelist),
            elapsed_seconds=int(elapsed) if elapsed.strip().isdigit() else None,
            submit=_timestamp(submit),
            start=_timestamp(start),
            end=_timestamp(end),
            reason=None if reason.strip() in ("", "None") else reason.strip(),
            source="sacct",
        ))
    return jobs


SQUEUE_FORMAT = "%i|%T|%N|%M|%V|%S|%r|%j"


def parse_squeue(text: str) -> list[JobInfo]:
    """Parse `squeue -h -o SQUEUE_FORMAT` output (JobName last)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 7)
        if len(parts) < 8:
            raise SlurmError(f"unexpected squeue line (wanted 8 fields): {line!r}")
        job_id, raw_state, nodelist, elapsed, submit, start, reason, name = parts
        state = normalize_state(raw_state)
        jobs.append(JobInfo(
            job_id=job_id.strip(),
            state=state,
            raw_state=raw_state.strip(),
            name=name,
            nodes=expand_hostlist(nodelist) if state != PENDING else [],
            elapsed_seconds=parse_duration(elapsed),
            submit=_timestamp(submit),
            start=_timestamp(start) if state != PENDING else None,
            reason=None if reason.strip() in ("", "None") else reason.strip(),
            source="squeue",
        ))
    return jobs


# ---------------------------------------------------------------- running commands


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


def run_waiting(command: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess:
    """An sbatch command line with --wait, run to its end: its exit status and output are the
    caller's to judge (a job array's tasks are checked by their outputs, not by sbatch's status)."""
    return _run(list(command), check=False, timeout=timeout)


def sbatch_command(
    batch_script: str | os.PathLike,
    *,
    nodes: int | None = None,
    time_minutes: float | None = None,
    partition: str | None = None,
    account: str | None = None,
    exclude: Iterable[str] = (),
    job_name: str | None = None,
    output: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    workdir: str | os.PathLike | None = None,
    script_args: Sequence[str] = (),
) -> list[str]:
    """The sbatch command line: built once for a seed's plan, then run as is (`submit_command`).

    Settings for the job travel in the environment (--export=ALL), as run.sub
    expects, so they are not part of this line.
    """
    # --no-requeue: mlrepro retries a failed seed itself, as a new attempt in its own folder and
    # away from the nodes it failed on. A job Slurm requeued after NODE_FAIL would instead run
    # again into the same folder (its first run's log beside the second: one seed, two runs).
    command = ["sbatch", "--parsable", "--export=ALL", "--no-requeue"]
    if job_name:
        command.append(f"--job-name={job_name}")
    if nodes is not None:
        if int(nodes) < 1:
            raise ValueError(f"nodes must be at least 1, not {nodes}")
        command.append(f"--nodes={int(nodes)}")
    if time_minutes is not None:
        if time_minutes <= 0:
            raise ValueError(f"time_minutes must be positive, not {time_minutes}")
        command.append(f"--time={math.ceil(time_minutes)}")
    if partition:
        command.append(f"--partition={partition}")
    if account:
        command.append(f"--account={account}")
    excluded = sorted({str(n) for n in exclude if str(n).strip()})
    if excluded:
        command.append(f"--exclude={','.join(excluded)}")
    if output:
        command.append(f"--output={output}")
    if workdir:
        command.append(f"--chdir={workdir}")
    command += [str(a) for a in extra_args]
    command.append(str(batch_script))
    command += [str(a) for a in script_args]
    return command


def submit(batch_script: str | os.PathLike, *, env: Mapping[str, object] | None = None, **options) -> str:
    """Submit `batch_script` with sbatch and return the job id.

    `env` is added to this process's environment and exported to the job; a
    refusal (bad partition, too many nodes, ...) raises SlurmError with Slurm's
    message.
    """
    return submit_command(sbatch_command(batch_script, **options), env=env, job_name=options.get("job_name"))


def _script_index(command: Sequence[str]) -> int:
    """Where the batch script stands in an sbatch_command line (after sbatch's own options)."""
    return next(i for i, arg in enumerate(command) if i > 0 and not arg.startswith("-"))


def for_attempt(command: Sequence[str], *, exclude: Iterable[str] = (), output: str | os.PathLike | None = None,
                workdir: str | os.PathLike | None = None) -> list[str]:
    """An sbatch_command line (a plan's) with one attempt's --exclude, --output and --chdir set in place of its own."""
    at = _script_index(command)
    ours = ("--exclude=", "--output=", "--chdir=")
    options = [arg for arg in command[:at] if not arg.startswith(ours)]
    excluded = sorted({str(n) for n in exclude if str(n).strip()})
    options += [f"--exclude={','.join(excluded)}"] if excluded else []
    options += [f"--output={output}"] if output else []
    options += [f"--chdir={workdir}"] if workdir else []
    return [*options, *command[at:]]


def submit_command(command: Sequence[str], *, env: Mapping[str, object] | None = None,
                   job_name: str | None = None) -> str:
    """Run an sbatch_command line and return the job id (see `submit`)."""
    command = list(command)
    batch_script = command[_script_index(command)]
    if not Path(batch_script).is_file():
        raise SlurmError(f"batch script {batch_script} does not exist")
    log.info("submitting: %s", " ".join(redact_command(command, _child_env(env))))
    if env:
        log.debug("job environment: %s", redact_env(env))
    try:
        proc = _run(command, env)
    except SlurmError as exc:
        raise SlurmError(f"sbatch refused {job_name or batch_script}: {exc.stderr or exc}",
                         command=exc.command, stderr=exc.stderr) from None
    job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if not job_id.split("_")[0].isdigit():
        raise SlurmError(f"sbatch printed no job id: {redact(proc.stdout + proc.stderr, env=_child_env(env))!r}",
                         command=redact_command(command, _child_env(env)))
    log.info("submitted %s as Slurm job %s", job_name or batch_script, job_id)
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


_SCONTROL_PAIR = re.compile(r"([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)")


def parse_scontrol_job(text: str) -> JobInfo | None:
    """Parse one job of `scontrol show job -o ID` (slurmctld's own record)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    fields = dict(_SCONTROL_PAIR.findall(line.strip()))
    exit_code, sig = _parse_exit(fields.get("ExitCode", ""))
    state = normalize_state(fields.get("JobState", ""))
    reason = fields.get("Reason", "").strip()
    return JobInfo(
        job_id=fields.get("JobId", "").strip(),
        state=state,
        raw_state=fields.get("JobState", "").strip(),
        name=fields.get("JobName", ""),
        exit_code=exit_code,
        signal=sig,
        nodes=expand_hostlist(fields.get("NodeList", "")) if state != PENDING else [],
        elapsed_seconds=parse_duration(fields.get("RunTime", "")),
        submit=_timestamp(fields.get("SubmitTime", "")),
        start=_timestamp(fields.get("StartTime", "")) if state != PENDING else None,
        end=_timestamp(fields.get("EndTime", "")) if state in TERMINAL_STATES else None,
        reason=None if reason in ("", "None") else reason,
        source="scontrol",
    )


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
) -> JobInfo:
    """Poll until job `job_id` reaches a terminal state and return its JobInfo.

    `on_state` is called whenever the state changes. A job that Slurm still does
    not know after `unknown_grace_seconds` raises SlurmError (a wrong id, or a
    cluster that lost it), as does `timeout_seconds` running out.
    """
    started = time.monotonic()
    last_state = None
    while True:
        info = job_info(job_id, status_command=status_command)
        if info.state != last_state:
            last_state = info.state
            if on_state is not None:
                on_state(info)
        if info.terminal:
            return info
        waited = time.monotonic() - started
        if info.state == UNKNOWN and waited > unknown_grace_seconds:
            raise SlurmError(f"Slurm does not know job {job_id} (waited {waited:.0f} s)"
                             + (f": {info.reason}" if info.reason else ""))
        if timeout_seconds is not None and waited > timeout_seconds:
            raise SlurmError(f"job {job_id} still {info.state} after {waited:.0f} s")
        time.sleep(poll_seconds)


def cancel(job_id: str | int, *, signal: str | None = None) -> None:
    """scancel the job (or send it `signal`, e.g. "USR1", without cancelling)."""
    command = ["scancel"]
    if signal:
        command.append(f"--signal={signal}")
    command.append(str(job_id))
    log.info("cancelling Slurm job %s", job_id)
    _run(command)


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
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", str(os.getuid()))
