"""What a finished seed's log held, kept beside it, so a log changed afterwards is named as such.

A seed's mllog.txt is written once, whole, when the seed finishes. Truncated or edited later (a full
disk, a careless copy, a hand edit), it used to be scored as a failed run, the score stayed valid on
the others and nothing said why or how to get the run back. finished.json keeps its size and hash;
the score of the seed compares, names the seed and the change, and gives the command that redoes it:
Snakemake's --forcerun of the seed's log runs the seed's job again, which takes its finished attempt
back from the attempt's own log when that is whole (mlrepro.launch.adopt) and trains only if not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mlrepro import paths
from mlrepro.paths import SeedPaths
from mlrepro.util.fsutil import atomic_write_json


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(seed_dir: Path, log: Path) -> None:
    """Keep what the seed's finished log holds."""
    atomic_write_json(paths.finished_file(seed_dir), {"file": log.name, "bytes": log.stat().st_size,
                                                      "sha256": _digest(log)})


def changed(seed_dir: Path, log: Path) -> str | None:
    """How the seed's log differs from what it held when the seed finished; None if it does not
    (or no record was kept: a seed finished before records were)."""
    kept = paths.read_json_if_exists(paths.finished_file(seed_dir))
    if not kept or kept.get("file") != log.name:
        return None
    try:
        size = log.stat().st_size
    except OSError:
        return f"{log} is gone ({kept['bytes']:,} bytes when the seed finished)"
    if size != kept.get("bytes"):
        how = "truncated" if size < kept.get("bytes", 0) else "grown"
        return f"{log} was {how} after the seed finished: {size:,} bytes, {kept['bytes']:,} when it finished"
    if _digest(log) != kept.get("sha256"):
        return f"{log} was changed after the seed finished (same size, other content)"
    return None


def rerun_command(system, benchmark: str, seed_dir: Path) -> str:
    """The command that redoes one seed (its kept run taken back, or trained again)."""
    target = paths.seed_files(benchmark, [SeedPaths(seed_dir).seed], SeedPaths.MLLOG)[0]
    profile = "slurm" if system.scheduler == "slurm" else "local"
    # The target first: --forcerun and --config each take every word up to the next option.
    return (f"snakemake --profile profiles/{profile} results/{benchmark}/score.json --forcerun {target} "
            f"--config system={system.name}")
