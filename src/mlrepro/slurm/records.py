"""What Slurm says of jobs, read: its states folded into ours, and sacct's, squeue's and scontrol's
lines parsed into JobInfo records (the commands themselves are spoken by mlrepro.slurm.client)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

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
    energy_j: float | None = None  # sacct's ConsumedEnergyRaw: only where the cluster gathers energy
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
                "Reason", "ConsumedEnergyRaw", "JobName")


def _energy(text: str) -> float | None:
    """ConsumedEnergyRaw (joules): empty, 0 or a sentinel (NO_VAL64) where no AcctGatherEnergyType plugin
    gathers it, which is not a job that used no energy."""
    text = text.strip()
    if not text.isdigit() or int(text) == 0 or int(text) >= 2**63:
        return None
    return float(text)


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
        job_id, raw_state, exit_text, nodelist, elapsed, submit, start, end, reason, energy, name = parts
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
            energy_j=_energy(energy),
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
