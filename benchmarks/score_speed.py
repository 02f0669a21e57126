"""Time to score a 10-run llama2_70b_lora folder: `mlrepro score` against the
official checkers run by hand (compliance_checker on each log, then rcp_checker
on the folder), each as the subprocess a user would type.

    python benchmarks/score_speed.py [--repeat 3]

Prints a table of wall-clock seconds (best of --repeat) and ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import logs_factory as lf  # noqa: E402
from mlrepro import scoring  # noqa: E402


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="score-speed-") as tmp:
        tmp = Path(tmp)
        folder = tmp / "llama2_70b_lora"
        logs = lf.write_runs(folder, lf.ten_runs())
        work = tmp / "cwd"  # the official tools write their .log files into the cwd
        work.mkdir()

        def run(cmd):
            subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)

        def by_hand():
            for log in logs:
                run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                     "--ruleset", "5.0.0", str(log)])
            run([sys.executable, "-m", "mlperf_logging.rcp_checker", str(folder), "--rcp_usage", "training",
                 "--rcp_version", "5.0.0"])

        def cli():
            run([sys.executable, "-m", "mlrepro", "score", str(folder), "--benchmark", "llama2_70b_lora"])

        rules = scoring.rules_for("llama2_70b_lora")

        def in_process():
            scoring.score_runs(logs, rules)

        rows = [("official checkers by hand (10 x compliance_checker + rcp_checker)", best_of(args.repeat, by_hand)),
                ("mlrepro score DIR (CLI, one process)", best_of(args.repeat, cli)),
                ("mlrepro.scoring.score_runs (in-process, warm)", best_of(args.repeat, in_process))]
    ref = rows[0][1]
    print(f"{'method':<70} {'seconds':>8} {'vs by hand':>11}")
    for name, secs in rows:
        print(f"{name:<70} {secs:8.2f} {ref / secs:10.1f}x")
    print("(mlrepro score also computes the olympic mean and the RCP scaling factor; by hand gives verdicts only)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
