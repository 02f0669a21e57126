"""Pass Megatron-LM's output through and, at its end, say how the job ended in the chain's words.

A seed run as a chain of time-limited jobs (mlrepro's `segments:`) expects its trainer to end a job
that reached the job limit with a line `segment: {json}` (status, from_step, to_step, train_s,
val_loss) and the job that finished the run with MLLOG's run_stop. Megatron-LM says the same in
its own words: `successfully loaded checkpoint ... at iteration N` (where the job started),
`successfully saved checkpoint from iteration N` (the last checkpoint), `exiting program after X
minutes` (--exit-duration-in-mins, the trainer's own clock) and its last `iteration N/ M` line.
A job killed before any of that prints nothing more: the chain resumes from the last checkpoint.

    "$@" 2>&1 | python3 segment_end.py      (run_and_time.sh)

Standard library only: the implementation imports nothing from mlrepro.
"""

from __future__ import annotations

import json
import re
import sys
import time

ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")
# Megatron-LM says "from iteration N", Megatron-DeepSpeed "at iteration N to DIR".
SAVED = re.compile(r"successfully saved checkpoint (?:from|at) iteration\s+(\d+)")
VALID = re.compile(r"validation(?:-\S+)? loss at iteration (\d+).*?lm loss value:\s*([-+0-9.eE]+)")
# Its own clock (--exit-duration-in-mins), or the save signal (--exit-signal-handler: the message names
# SIGTERM whichever signal --exit-signal chose).
TIME_LIMIT = re.compile(r"exiting program after (?:[\d.]+ minutes|receiving SIG\w+)")
# The training loop ran to --train-iters (its clock and signal exits leave the process before it): the last
# iteration is logged only where --log-interval divides it.
DONE = re.compile(r"\[after training is done\]")


class Segment:
    def __init__(self) -> None:
        self.from_step = 0
        self.last = self.train_iters = None
        self.saved = None
        self.val_loss = None
        self.train_s = 0.0
        self.time_limit = False
        self.done = False

    def feed(self, line: str) -> None:
        if m := ITER.search(line):
            step, self.train_iters = int(m[1]), int(m[2])
            before = self.last if self.last is not None else self.from_step
            self.train_s += float(m[3]) / 1e3 * max(0, step - before)
            self.last = step
        elif m := LOADED.search(line):
            self.from_step = int(m[1])
        elif m := SAVED.search(line):
            self.saved = int(m[1])
        elif m := VALID.search(line):
            self.val_loss = float(m[2])
        elif TIME_LIMIT.search(line):
            self.time_limit = True
        elif DONE.search(line):
            self.done = True

    def record(self, status: str, to_step: int) -> str:
        return "segment: " + json.dumps({"status": status, "from_step": self.from_step, "to_step": to_step,
                                         "train_s": round(self.train_s, 3), "val_loss": self.val_loss})

    def ending(self) -> list[str]:
        """The lines that tell the chain how this job ended; none for a job killed on the way."""
        if self.last is not None and (self.last == self.train_iters or (self.done and not self.time_limit)):
            stop = {"namespace": "", "time_ms": int(time.time() * 1000), "event_type": "INTERVAL_END",
                    "key": "run_stop", "value": None, "metadata": {"status": "success", "step": self.train_iters}}
            return [self.record("success", self.train_iters), ":::MLLOG " + json.dumps(stop)]
        if self.time_limit and self.saved is not None:
            return [self.record("resume", self.saved)]
        return []


def main() -> int:
    seg = Segment()
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        seg.feed(line)
    for line in seg.ending():
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
