"""The corpus rules through the real snakemake: the miniature chain from a localhost server, and plans."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from mlrepro.corpus import minicorpus, shards
from mlrepro.formats import indexed
from workspace import make_workspace, planned_jobs, run_snakemake, wait_for

MINI = "resources/corpora/mini_corpus"


def test_slimpajama_quick_plan_shows_the_array_tasks_and_chunks(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    # On Slurm: one job per array stage, whose plan line is the one sbatch --array it submits.
    proc = run_snakemake(ws, "-n", "--profile", "profiles/slurm", "--config", "corpora=[slimpajama_quick]",
                         "system=local-slurm", "--", "resources/corpora/slimpajama_quick/data_prefix.json", timeout=300)
    out = proc.stdout + proc.stderr
    assert planned_jobs(out) == {"corpus_download": 1, "corpus_downloaded": 1, "corpus_tokenizer": 1,
                                 "corpus_extract": 8, "corpus_concat": 8, "corpus_preprocess": 1, "corpus_blend": 1}
    download = next(line for line in out.splitlines() if "download as one Slurm job array" in line)
    assert "of 16 tasks (RANK=$SLURM_ARRAY_TASK_ID, WORLD_SIZE=16)" in download
    assert "sbatch " in download and " --array=0-15 " in download and " --wait " in download
    assert download.rstrip().endswith("slurm/download.sbatch") and "--partition=debug" in download
    preprocess_line = next(line for line in out.splitlines() if "preprocess as one Slurm job array" in line)
    assert " --array=0-7 " in preprocess_line and "--cpus-per-task=16" in preprocess_line
    # The full corpus: 75 chunks. Without Slurm the same two stages run their tasks on this machine.
    full = run_snakemake(ws, "-n", "--config", "corpora=[slimpajama]", "--",
                         "resources/corpora/slimpajama/data_prefix.json", timeout=300)
    full_out = full.stdout + full.stderr
    assert planned_jobs(full_out)["corpus_extract"] == 75
    assert "slimpajama: download, 16 tasks in parallel on this machine" in full_out
    assert "slimpajama: preprocess, 75 chunks one after the other on this machine, 16 workers each" in full_out


def test_invalid_corpus_config_stops_before_any_job(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    path = ws / "config" / "corpora" / "mini_corpus.yaml"
    path.write_text(path.read_text().replace("files_per_chunk: 4", "files_per_chunk: four"))
    proc = run_snakemake(ws, "-n", "--config", "corpora=[mini_corpus]", check=False, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "config/corpora/mini_corpus.yaml" in out and "concat.files_per_chunk" in out


def _run_chain(tmp_path, *args: str, ws: Path | None = None) -> tuple:
    """The miniature chain from a local HTTP server (one shard answers 429 first); (workspace, seconds)."""
    ws = ws or make_workspace(tmp_path / "ws")
    served = minicorpus.make_mini_corpus(tmp_path / "srv")
    server = minicorpus.serve(served, rate_limited=("/mini/chunk1/part_2.jsonl.zst",))
    try:
        config = ws / "config" / "corpora" / "mini_corpus.yaml"
        # This server, not the one the workflow serves the miniature from (`served:`): its faults are the test.
        text = config.read_text().replace("served: mini_corpus\n", "")
        config.write_text(text.replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
        start = time.monotonic()
        run_snakemake(ws, *args, "--", f"{MINI}/data_prefix.json", timeout=600)
        seconds = time.monotonic() - start
    finally:
        server.shutdown()
    print(f"miniature chain ({' '.join(args)}): {seconds:.1f} s")
    return ws, seconds


def _check_chain(ws) -> list:
    base = ws / MINI
    download = json.loads((base / "download.json").read_text())
    assert download["num_files"] == 9 and download["missing"] == ["mini_chunk2_part3.jsonl.zst"]
    assert not list((base / "shards").glob("*.zst"))  # removed once extracted
    # 10 shard positions, 4 per chunk: 4 + 4 + 1 files (position 8 is the hole); 150 documents each.
    readers = [indexed.IndexedReader(base / f"preprocessed/train_chunk_{g}_text_document") for g in range(3)]
    assert [r.num_documents for r in readers] == [600, 600, 150]
    blend = json.loads((base / "data_prefix.json").read_text())
    tokens = [int(r.sequence_lengths.sum()) for r in readers]
    assert blend["total_tokens"] == sum(tokens)
    assert blend["data_prefix"][1::2] == [f"{MINI}/preprocessed/train_chunk_{g}_text_document" for g in range(3)]
    assert abs(sum(blend["data_prefix"][::2]) - 1) < 1e-5

    # Chunks hold the shards of their positions, in order; the hole does not move the others.
    def members(g):
        lines = (base / f"concat/train_chunk_{g}.jsonl").read_text().splitlines()
        return [tuple(json.loads(line)["meta"].values()) for line in lines[::150]]

    assert members(1) == [(1, 4), (2, 0), (2, 1), (2, 2)] and members(2) == [(2, 4)]
    return readers


@pytest.mark.slow
def test_mini_corpus_chain_from_a_local_server(tmp_path):
    ws, _ = _run_chain(tmp_path, "--cores", "2", "--config", "corpora=[mini_corpus]")
    _check_chain(ws)
    base = ws / MINI
    assert "HTTP 429" in (ws / "logs/corpora/mini_corpus/download.log").read_text()  # retried, then fetched
    # Done is done; a lost chunk is redone alone (no download, no other chunk).
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(
        run_snakemake(ws, "-n", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/data_prefix.json"))
    before = (base / "preprocessed/train_chunk_2_text_document.bin").read_bytes()
    kept = (base / "preprocessed/train_chunk_0_text_document.bin").stat().st_mtime_ns
    (base / "preprocessed/train_chunk_2_text_document.bin").unlink()
    proc = run_snakemake(ws, "--cores", "2", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/data_prefix.json",
                         timeout=300)
    assert planned_jobs(proc.stdout + proc.stderr) == {"corpus_preprocess": 1, "corpus_blend": 1}
    assert "1 of 3 tasks to run" in (ws / "logs/corpora/mini_corpus/preprocess.log").read_text()
    assert (base / "preprocessed/train_chunk_2_text_document.bin").read_bytes() == before
    assert (base / "preprocessed/train_chunk_0_text_document.bin").stat().st_mtime_ns == kept


def _array_tasks(log: Path, n: int) -> tuple[str, list[tuple[str, str]]]:
    """The Slurm array job a stage's log names, and (task id, state) of each of its tasks from sacct
    (accounting can lag a few seconds behind the job's end: it is asked until it lists `n` tasks)."""
    job_id = re.search(r"Slurm array job (\d+) ended", log.read_text()).group(1)

    def rows():
        out = subprocess.run(["sacct", "-X", "-P", "-n", "-j", job_id, "-o", "JobID,State"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
        got = sorted(tuple(r.split("|")) for r in out)
        return got if len(got) == n and all("_" in t for t, _ in got) else None

    return job_id, wait_for(rows, 60, f"sacct to list the {n} tasks of array job {job_id}")


@pytest.mark.slow
@pytest.mark.slurm
def test_mini_corpus_chain_on_the_local_slurm_cluster(tmp_path, slurm_cluster):
    ws, seconds = _run_chain(tmp_path, "--profile", "profiles/slurm", "--config", "corpora=[mini_corpus]",
                             "system=local-slurm", "--slurm-init-seconds-before-status-checks", "1")
    _check_chain(ws)
    logs = ws / "logs/corpora/mini_corpus"
    for stage in ("download", "preprocess"):
        job_id, tasks = _array_tasks(logs / f"{stage}.log", 3)
        # ONE array job per stage, one task per RANK (download) or chunk (preprocess), all done.
        assert tasks == [(f"{job_id}_{i}", "COMPLETED") for i in range(3)], tasks
        assert all((logs / f"{stage}_task_{i}.log").is_file() for i in range(3))
    assert "HTTP 429" in "".join((logs / f"download_task_{i}.log").read_text() for i in range(3))
    assert "task 1 of 3" in (logs / "download_task_1.log").read_text()  # RANK=1, WORLD_SIZE=3


@pytest.mark.slow
def test_mini_corpus_chain_with_bytes_per_chunk(tmp_path):
    """Chunks bounded by bytes: planned once the download is verified; a lost chunk comes back byte-identical."""
    ws = make_workspace(tmp_path / "ws")
    config = ws / "config" / "corpora" / "mini_corpus.yaml"
    # About two compressed shards per chunk (each is 9-10 kB): the count follows from the sizes.
    config.write_text(config.read_text().replace("files_per_chunk: 4", "bytes_per_chunk: 20000"))
    ws, _ = _run_chain(tmp_path, "--cores", "2", "--config", "corpora=[mini_corpus]", ws=ws)
    base = ws / MINI
    record = json.loads((base / "download.json").read_text())
    sizes = [s["size"] for s in record["shards"]]
    chunks = [range(a, b) for a, b in record["chunks"]]
    assert chunks == shards.groups_by_bytes(sizes, 20000) and len(chunks) > 3
    assert json.loads((base / "preprocessed.json").read_text())["prefixes"] == [
        f"{MINI}/preprocessed/train_chunk_{g}_text_document" for g in range(len(chunks))]
    lines = sum(len((base / f"concat/train_chunk_{g}.jsonl").read_text().splitlines()) for g in range(len(chunks)))
    assert lines == 9 * 150
    before = (base / "concat/train_chunk_1.jsonl").read_bytes()
    (base / "concat/train_chunk_1.jsonl").unlink()
    run_snakemake(ws, "--cores", "2", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/concat/train_chunk_1.jsonl",
                  timeout=300)
    assert (base / "concat/train_chunk_1.jsonl").read_bytes() == before
