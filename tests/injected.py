"""A workspace for the injected-failure miniature (issue 33): mini_gpt's corpus built here, its seeds
with the benchmark's `inject_failures:` block."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mlrepro.corpus import minicorpus
from mlrepro.paths import SeedPaths
from mlrepro.util.fsutil import atomic_write_json
from workspace import FIXTURES, make_workspace, run_snakemake

# mini_gpt's seed 1 on the local Slurm cluster with failures injected: its segments.json and attempt
# records as written (cut from tests/slurm/test_goodput_slurm.py's run).
INJECTED_RUN = FIXTURES / "goodput" / "slurm_injected_seed_1.json"


def injected_attempts(seed_dir: Path) -> dict:
    """The seed folder's segments.json and attempt records those of that real run: its effective training
    time, restart and checkpoint costs are then measured ones. Returns the run's records."""
    run = json.loads(INJECTED_RUN.read_text())
    files = SeedPaths(seed_dir)
    files.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(files.segments, {"segments": run["segments"]})
    for record in run["attempts"]:
        files.attempt(record["attempt"]).folder.mkdir(parents=True)
        atomic_write_json(files.attempt(record["attempt"]).record, record)
    return run


def injected_workspace(tmp: Path, inject: dict, seeds: list[int]) -> Path:
    """A workspace whose corpus stages have run here, mini_gpt's `seeds` with `inject` as inject_failures."""
    ws = make_workspace(tmp / "ws")
    spec = yaml.safe_load((ws / "config/benchmarks/mini_gpt.yaml").read_text())
    spec.update(seeds=seeds, required_runs=len(seeds), inject_failures=inject)
    (ws / "config/benchmarks/mini_gpt.yaml").write_text(yaml.safe_dump(spec))
    server = minicorpus.serve(minicorpus.make_mini_corpus(tmp / "srv"))
    try:
        corpus = ws / "config/corpora/mini_corpus.yaml"
        corpus.write_text(corpus.read_text().replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
        run_snakemake(ws, "--profile", "profiles/local", "--", "resources/corpora/mini_corpus/data_prefix.json",
                      timeout=900)
    finally:
        server.shutdown()
    return ws
