"""An attempt's life, as one policy for every backend and every kind of benchmark: what class an ended
attempt belongs to, whether the seed goes on, and when a running attempt is hung.

Long pretraining runs are interrupted as a matter of course (Llama 3 405B: 419 unexpected
interruptions in 54 days), so the question after an attempt ends is never "retry?" but "what
happened?". Each ended attempt gets exactly one class:

    finished                  the run reached run_stop
    saved_at_limit            the trainer saved at its job's limit (or on the save signal) and stopped
    cancelled                 scancel, preemption, or a cancel by the workflow's owner
    node_failure              the node, not the program: NODE_FAIL/BOOT_FAIL, a failed quick preflight, a GPU error
    hung                      no progress for longer than the hang timeout; stopped by the watch
    failed_before_first_step  the trainer died before its first new step: a load or configuration error
    failed_mid_run            the trainer died after training some steps
    injected                  killed by the benchmark's failure injection (`inject_failures:`, tests and benchmarks)

and the policy decides from the classes: a failure before the first new step, or the same error
signature twice in a row, ends the seed at once (retrying cannot mend it) with the trainer's own last
error lines; every other failure uses one budget of failed attempts per seed, shared by the chain's
segments and the seed's retries, that a new checkpoint refills (progress is what a long run needs).

An injected failure (`Injection`) kills a running attempt after an exponentially distributed time
drawn from a seeded generator, as a failure of the hardware would: the chain goes on from its last
checkpoint (a seed that does not checkpoint starts again), spending no budget, so that the effective
training time of a run with failures at a known rate can be measured against a prediction.

The hang rule follows nvidia-resiliency-ext's computed timeouts: an attempt with no progress line for
longer than `multiple` x the longest interval between progress lines seen so far (at least `floor_s`),
or, before its first progress line, for longer than `startup_s`, is hung.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

FINISHED = "finished"
SAVED_AT_LIMIT = "saved_at_limit"
CANCELLED = "cancelled"
NODE_FAILURE = "node_failure"
HUNG = "hung"
FAILED_BEFORE_FIRST_STEP = "failed_before_first_step"
FAILED_MID_RUN = "failed_mid_run"
INJECTED = "injected"
CLASSES = (FINISHED, SAVED_AT_LIMIT, CANCELLED, NODE_FAILURE, HUNG, FAILED_BEFORE_FIRST_STEP, FAILED_MID_RUN,
           INJECTED)
# What a person reads in the segments table, failure.json, `mlrepro status` and the report.
DESCRIPTIONS = {
    FINISHED: "finished",
    SAVED_AT_LIMIT: "saved at its limit",
    CANCELLED: "preempted or cancelled",
    NODE_FAILURE: "node failure",
    HUNG: "hung",
    FAILED_BEFORE_FIRST_STEP: "failed before its first new step",
    FAILED_MID_RUN: "failed mid-run",
    INJECTED: "killed by the failure injection",
}
# Classes that are not the trainer failing: they neither use the budget nor end the seed.
NOT_FAILURES = {FINISHED, SAVED_AT_LIMIT, CANCELLED, INJECTED}
# The backend's state of an attempt the failure injection killed (failure.json, attempt.json).
INJECTED_STATE = "INJECTED"

# Scheduler or backend states that say the node is at fault (mlrepro.slurm.node_health agrees).
NODE_STATES = {"NODE_FAIL", "BOOT_FAIL", "PREFLIGHT_FAILED"}
CANCEL_STATES = {"CANCELLED", "PREEMPTED", "REQUEUED", "DEADLINE"}

# A training step in a trainer's output: mini_gpt's progress line, Megatron-LM's (and
# Megatron-DeepSpeed's) iteration line, an MLLOG event that carries samples_count (mini_lora and
# NVIDIA's implementations log their blocks and evaluations so), and an explicit heartbeat line.
STEP_LINE = re.compile(
    r"progress: step (?P<mini>\d+)/"
    r"|\biteration\s+(?P<megatron>\d+)/\s*\d+\s*\|"
    r"|:::MLLOG .*\"samples_count\":\s*(?P<samples>\d+)"
    r"|\bheartbeat\b")
# Case matters: "failed" in a folder's name is no error.
_ERROR_LINE = re.compile(r"\w(?:Error|Exception)\b|Traceback|\b[Ee]rror:|\bERROR\b|\bFAILED\b|Killed|Aborted|"
                         r"[Ss]egmentation fault|exited with|No such file")
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:\d+:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))\b:?(.*)$")
_VOLATILE = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass(frozen=True)
class Ended:
    """What is known of an attempt once it has ended."""

    state: str  # the backend's final state: COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL, HUNG, ...
    log_text: str = ""
    finished: bool = False  # the run's log has run_stop
    saved_at_limit: bool = False  # the trainer said it saved and stopped for its job's limit
    node_side: str | None = None  # why the node is blamed (mlrepro.slurm.node_health.node_side), if it is
    exit_code: int | None = None


# A resumed trainer says so once its checkpoint is loaded; mini_gpt prints its MLLOG up to the checkpoint
# again before that line, and those replayed evaluations are no new steps.
RESUMED = re.compile(r"resuming from .*\(step \d+\)|successfully loaded checkpoint from .* at iteration \d+")


def steps_in(text: str) -> list[int]:
    """The new progress lines of a log's text (after a resume's marker, where there is one), as step (or
    sample) numbers, in order (heartbeats as -1)."""
    found = []
    resumed = None
    for resumed in RESUMED.finditer(text):
        pass
    for m in STEP_LINE.finditer(text, resumed.end() if resumed else 0):
        number = m.group("mini") or m.group("megatron") or m.group("samples")
        found.append(int(number) if number is not None else -1)
    return found


def classify(ended: Ended) -> str:
    """The one class of an ended attempt (see the module's table)."""
    if ended.finished:
        return FINISHED
    if ended.state == INJECTED_STATE:
        return INJECTED
    if ended.state == "HUNG":
        return HUNG
    if ended.state in NODE_STATES or ended.node_side:
        return NODE_FAILURE
    if ended.state in CANCEL_STATES:
        return CANCELLED
    if ended.saved_at_limit:
        return SAVED_AT_LIMIT
    if ended.state == "COMPLETED" and ended.exit_code in (None, 0):
        # A trainer that ended well without run_stop or a saved segment ended its run some other way.
        return FAILED_MID_RUN if steps_in(ended.log_text) else FAILED_BEFORE_FIRST_STEP
    return FAILED_MID_RUN if steps_in(ended.log_text) else FAILED_BEFORE_FIRST_STEP


# What launchers say about a rank that failed (torchrun's ChildFailedError report, srun's and run.sub's own
# lines) is not the rank's error: the trainer's own words stand before it.
_LAUNCHER_LINE = re.compile(r"^(?:srun|run\.sub|mlrepro): ")
_LAUNCHER_END = re.compile(r"ChildFailedError")
_LAUNCHER_START = re.compile(r"Traceback \(most recent call last\)|torch[./]distributed[./](?:elastic|run)")


def _trainer_lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not _LAUNCHER_LINE.match(ln.strip())]
    end = next((i for i, ln in enumerate(lines) if _LAUNCHER_END.search(ln)), None)
    if end is not None:
        start = end
        # Back over the launcher's traceback: its indented frames, its "Traceback" line, its own log lines.
        while start > 0 and (lines[start - 1].startswith((" ", "\t")) or _LAUNCHER_START.search(lines[start - 1])):
            start -= 1
        lines = lines[:start]
    return lines


def error_lines(text: str, limit: int = 12, strict: bool = False) -> list[str]:
    """The trainer's own last error lines: the last traceback's tail, else the last lines that look like
    errors, else (unless `strict`) its last lines, whatever they say. Launchers' reports are left out."""
    lines = _trainer_lines(text)
    last_tb = max((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), default=None)
    if last_tb is not None:
        tail = lines[last_tb:]
        exc = max((i for i, ln in enumerate(tail) if _EXCEPTION.match(ln.strip())), default=len(tail) - 1)
        return tail[max(0, exc + 1 - limit):exc + 1]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)][-limit:]
    return errors if errors or strict else lines[-3:]


def signature(text: str) -> str | None:
    """What identifies a failure across attempts: the exception (or last error line) with its numbers and
    addresses blanked, hashed. None when the log names no error."""
    errors = error_lines(text, strict=True)
    if not errors:
        return None
    named = [m for ln in errors if (m := _EXCEPTION.match(ln.strip()))]
    key = f"{named[-1].group(1)}:{named[-1].group(2).strip()}" if named else errors[-1].strip()
    return hashlib.sha1(_VOLATILE.sub("N", key).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Verdict:
    """What the policy says after an attempt: go on (another attempt), or end the seed (and why)."""

    go_on: bool
    reason: str = ""


@dataclass
class Budget:
    """Failed attempts a seed may absorb in a row without progress: `retries` (the benchmark's key) are
    shared by a chain's segments and the seed's retries, and a new checkpoint refills them."""

    retries: int
    used: int = 0
    last_signature: str | None = None
    history: list[str] = field(default_factory=list)

    def after(self, cls: str, sig: str | None, progressed: bool, chained: bool, recovered: bool = False) -> Verdict:
        """Record an ended attempt of class `cls` (error signature `sig`; `progressed`: it left a newer
        checkpoint; `recovered`: its cause was removed, a bad last checkpoint set aside) and say whether
        the seed goes on."""
        self.history.append(cls)
        if cls == FINISHED:
            return Verdict(False, "finished")
        repeated = sig is not None and sig == self.last_signature
        self.last_signature = sig if cls not in NOT_FAILURES else self.last_signature
        if cls == SAVED_AT_LIMIT:
            self.used = 0
            return Verdict(True)
        if cls == INJECTED:
            # A failure made on purpose at a set rate: what it costs is measured, not held against the seed.
            return Verdict(True)
        if cls == CANCELLED:
            # Someone's decision: a chain waits for no one and goes on; a single job stays cancelled
            # until the workflow is run again.
            return Verdict(chained, "" if chained else "cancelled")
        if recovered:
            # Its cause is gone (the next attempt starts from another checkpoint): no budget spent. A
            # checkpoint is set aside once, so this cannot repeat for ever.
            self.last_signature = None
            return Verdict(True)
        elif cls == FAILED_BEFORE_FIRST_STEP:
            return Verdict(False, "a load or configuration error, which retrying cannot mend")
        elif repeated and cls == FAILED_MID_RUN:
            return Verdict(False, "the same error twice in a row")
        self.used = 0 if progressed else self.used + 1
        if self.used > self.retries:
            return Verdict(False, f"{self.used} failed attempt(s) in a row without progress, beyond its budget "
                                  f"of {self.retries} retr{'y' if self.retries == 1 else 'ies'}")
        return Verdict(True)


@dataclass(frozen=True)
class HangRule:
    """When a running attempt counts as hung (the benchmark's `hang:` block)."""

    multiple: float = 5.0  # x the longest interval between progress lines seen so far
    floor_s: float = 600.0  # never less than this once training has started: a save or an evaluation is quiet
    startup_s: float = 1800.0  # before the first progress line: loading, compiling, the first evaluation

    @classmethod
    def of(cls, block: dict | None) -> HangRule | None:
        """The rule of a benchmark's `hang:` block; None when the block turns the watch off."""
        block = {} if block is None else block
        if block.get("enabled") is False:
            return None
        return cls(float(block.get("multiple", cls.multiple)), float(block.get("floor_seconds", cls.floor_s)),
                   float(block.get("startup_seconds", cls.startup_s)))

    def timeout(self, longest_interval: float | None) -> float:
        if longest_interval is None:
            return self.startup_s
        return max(self.floor_s, self.multiple * longest_interval)


class HangWatch:
    """Follows an attempt's logs as they grow and says when it is hung (`poll`). Only new bytes are read."""

    def __init__(self, rule: HangRule, logs: Callable[[], Iterable[Path]], clock: Callable[[], float] = time.monotonic):
        self.rule, self._logs, self._clock = rule, logs, clock
        self._offsets: dict[Path, int] = {}
        self._started = self._last = clock()
        self.longest: float | None = None
        self.progress_lines = 0
        self.last_line = ""
        self._partial: dict[Path, bytes] = {}

    def _new_lines(self) -> list[str]:
        lines = []
        for path in self._logs():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets.get(path, 0))
                    chunk = fh.read(1 << 20)
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            *complete, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            lines += [ln.decode(errors="replace") for ln in complete if ln.strip()]
        return lines

    def poll(self) -> str | None:
        """None while the attempt makes progress; once it is hung, why (with its last line)."""
        now = self._clock()
        for line in self._new_lines():
            self.last_line = line.strip()[:300]
            if STEP_LINE.search(line):
                if self.progress_lines:
                    self.longest = max(self.longest or 0.0, now - self._last)
                self.progress_lines += 1
                self._last = now
        quiet = now - self._last
        timeout = self.rule.timeout(self.longest)
        if quiet <= timeout:
            return None
        since = (f"since it started (start-up timeout {timeout:.0f} s)" if self.longest is None else
                 f"(timeout {timeout:.0f} s: {self.rule.multiple:g} x the longest interval between progress "
                 f"lines, {self.longest or 0:.1f} s, at least {self.rule.floor_s:.0f} s)")
        return f"no progress for {quiet:.0f} s {since}; last line: {self.last_line or '(none)'}"


_QUIET = re.compile(r"no progress for (\d+(?:\.\d+)?) s")


def hung_for(reason: str | None) -> float | None:
    """The seconds a hung attempt went without progress before the watch stopped it, from the reason
    HangWatch.poll gave (None for any other reason)."""
    m = _QUIET.search(reason or "")
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class Injection:
    """Failures injected at a set rate (the benchmark's `inject_failures:` block): each running attempt
    is killed after a time drawn from an exponential distribution of mean `mtbf_s`, the time between
    failures of a machine that fails at random. The draw depends only on the block's `seed`, the
    benchmark's seed and the attempt's number, so a workflow run again kills its attempts at the same
    times, and two seeds fail independently."""

    mtbf_s: float
    seed: int = 0

    @classmethod
    def of(cls, block: dict | None) -> Injection | None:
        """The injection of a benchmark's `inject_failures:` block; None when there is none."""
        if not block:
            return None
        return cls(float(block["mtbf_seconds"]), int(block.get("seed", 0)))

    def kill_after(self, seed: int, attempt: int) -> float:
        """Seconds after attempt `attempt` of seed `seed` starts running that it is killed."""
        return random.Random(f"inject:{self.seed}:{seed}:{attempt}").expovariate(1.0 / self.mtbf_s)

    def reason(self, after_s: float) -> str:
        return (f"{INJECTED}: killed by the failure injection {after_s:.1f} s after it started "
                f"(inject_failures: mean time between failures {self.mtbf_s:g} s)")
