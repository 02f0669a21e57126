"""Does telling progress slow a download? A localhost download with and without a progress meter.

    PYTHONPATH=src python benchmarks/progress_overhead.py [--mib 256] [--rounds 5]

A file is served over HTTP on 127.0.0.1 (mlrepro.corpus.served) and fetched by
mlrepro.data.http.http_download, rounds alternating between: no meter; a meter at the stages'
interval (10 s); a meter reporting every 0.05 s (200 times the stages' rate, to make any cost
visible); and a folder watcher (what an implementation's download script gets) sampling a
1000-file folder. Prints the median time of each and its ratio to no meter.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from mlrepro.corpus import served
from mlrepro.data import http
from mlrepro.util import progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="progress-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "serve").mkdir()
        with open(tmp / "serve" / "blob.bin", "wb") as fh:
            block = bytes(range(256)) * 4096
            for _ in range(args.mib):
                fh.write(block)
        many = tmp / "many"
        many.mkdir()
        for i in range(1000):
            (many / f"f{i}").write_bytes(b"x" * 100)
        server = served.serve(tmp / "serve")
        url = f"http://127.0.0.1:{server.server_address[1]}/blob.bin"

        def download(meter) -> float:
            dest = tmp / "out" / "blob.bin"
            dest.unlink(missing_ok=True)
            started = time.perf_counter()
            http.http_download(url, dest, progress=meter.add if meter else None)
            took = time.perf_counter() - started
            if meter:
                meter.close()
            return took

        def watched() -> float:
            with progress.watch_folder("watch", many, tmp / "w.json", interval=0.05):
                return download(None)

        variants = {
            "no meter": lambda: download(None),
            "meter, 10 s interval": lambda: download(progress.Meter("bench", tmp / "p.json", interval=10)),
            "meter, 0.05 s interval": lambda: download(progress.Meter("bench", tmp / "p.json", interval=0.05)),
            "folder watcher, 0.05 s": watched,
        }
        # the order rotates every round: on a shared machine whatever runs first in a round is favoured
        times: dict[str, list[float]] = {name: [] for name in variants}
        download(None)  # warm the page cache and the server
        names = list(variants)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(variants[name]())
        server.shutdown()
        started = time.perf_counter()
        for _ in range(20):
            progress.folder_size(many)
        size_ms = (time.perf_counter() - started) / 20 * 1000
    meter = progress.Meter("calls", None, timer=False)
    started = time.perf_counter()
    for _ in range(200_000):
        meter.add(1 << 20)
    add_us = (time.perf_counter() - started) / 200_000 * 1e6
    base = statistics.median(times["no meter"])
    print(f"{args.mib} MiB over localhost HTTP, median of {args.rounds} rounds (order rotating)")
    print(f"{'variant':<26} {'seconds':>8} {'MiB/s':>8} {'ratio':>7}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<26} {med:8.3f} {args.mib / med:8.0f} {med / base:7.3f}")
    print(f"folder_size of 1000 files: {size_ms:.2f} ms a sample")
    per_mib_ms = base / args.mib * 1000
    print(f"Meter.add: {add_us:.2f} us a call (one call per 1 MiB block), against {per_mib_ms:.2f} ms to download "
          f"1 MiB here: {add_us / 1000 / per_mib_ms:.5%} of the time")


if __name__ == "__main__":
    main()
