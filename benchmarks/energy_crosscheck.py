"""Each attempt's energy from NVML's counters (attempt.json's energy_j) against nvidia-smi's power.draw
sampled beside the run and integrated over the attempt's own start..end (issue 24).

    python benchmarks/energy_crosscheck.py SMI_CSV ATTEMPT_JSON...

SMI_CSV: `nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv -lms 500` (UTC
clock), as device/energy_run.sh records it. Prints one row per attempt and the total, with the
difference in %.
"""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime, timezone
from pathlib import Path


def power_samples(path: Path) -> dict[str, list[tuple[float, float]]]:
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    for row in csv.reader(path.open()):
        if row and row[0][:1].isdigit():
            t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
            by_gpu.setdefault(row[1].strip(), []).append((t, float(row[2].split()[0])))
    return by_gpu


def joules(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """Trapezoid of watts over the part of each sampling interval that falls in start..end."""
    total = 0.0
    for (t1, p1), (t2, p2) in zip(samples, samples[1:]):
        lo, hi = max(t1, start), min(t2, end)
        if hi > lo:
            total += (hi - lo) * (p1 + p2) / 2
    return total


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    by_gpu = power_samples(Path(argv[0]))
    print("| attempt | start (UTC) | elapsed s | NVML J | nvidia-smi J | difference | mean W |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    nvml = smi = 0.0
    for name in argv[1:]:
        a = json.loads(Path(name).read_text())
        start, end = (datetime.fromisoformat(a[k]).timestamp() for k in ("start", "end"))
        seen = sum(joules(s, start, end) for s in by_gpu.values())
        nvml, smi = nvml + a["energy_j"], smi + seen
        print(f"| {Path(name).stem} | {a['start']} | {a['elapsed_s']:.1f} | {a['energy_j']:.0f} | {seen:.0f} | "
              f"{a['energy_j'] / seen - 1:+.1%} | {a['energy_j'] / a['elapsed_s']:.0f} |")
    print(f"| all | | | {nvml:.0f} | {smi:.0f} | {nvml / smi - 1:+.2%} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
