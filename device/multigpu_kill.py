"""Kill one segment of a chained seed mid-way (issue 23, device/multigpu_run.sh): wait until attempt
SEGMENT of the seed has saved a checkpoint of its own and trained HALF a save interval past it, then
SIGKILL that attempt's run_and_time.sh (the local backend's watchdog takes its ranks with it). Prints
one JSON line: the attempt, the step at the kill and the last checkpoint then.

    python3 device/multigpu_kill.py SEED_DIR [SEGMENT=2] [SAVE_INTERVAL=100] [TIMEOUT_S=600]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from mlrepro.formats import checkpoints
from mlrepro.pretrain import progress


def main(seed: Path, segment: int = 2, save_interval: int = 100, timeout: float = 600) -> int:
    attempt = seed / f"attempt_{segment}"
    deadline = time.monotonic() + timeout
    start_step = None
    while time.monotonic() < deadline:
        pid_file = attempt / "run.pid"
        live = progress.live(seed) if pid_file.is_file() else None
        saved = checkpoints.latest_step(seed / "checkpoints")
        if live and start_step is None:
            start_step = saved  # where this attempt resumed
        if live and start_step is not None and saved > start_step and live.get("step", 0) >= saved + save_interval // 2:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            print(json.dumps({"killed_attempt": segment, "pid": pid, "step_at_kill": live["step"],
                              "last_checkpoint": saved, "resumed_from": start_step}), flush=True)
            return 0
        time.sleep(0.5)
    print(json.dumps({"killed_attempt": None, "why": f"attempt {segment} never got half an interval past a save"}))
    return 1


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(Path(args[0]), *(int(a) for a in args[1:4])))
