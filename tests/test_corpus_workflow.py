"""The corpus rules through the real snakemake: the miniature chain from a localhost server, and plans."""

from __future__ import annotations

import json
import time

import pytest

from mlrepro.corpus import indexed, minicorpus
from workspace import make_workspace, planned_jobs, run_snakemake

MINI = "resources/corpora/mini_corpus"


def test_slimpajama_quick_plan_shows_the_array_tasks_and_chunks(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = run_snakemake(ws, "-n", "--config", "corpora=[slimpajama_quick]", timeout=300)
    jobs = planned_jobs(proc.stdout + proc.stderr)
    assert jobs == {"all": 1, "corpus_download": 16, "corpus_downloaded": 1, "corpus_tokenizer": 1,
                    "corpus_extract": 8, "corpus_concat": 8, "corpus_preprocess": 8, "corpus_blend": 1} | {
        k: v for k, v in jobs.items() if not k.startswith("corpus_") and k != "all"}
    full = planned_jobs((lambda p: p.stdout + p.stderr)(run_snakemake(
        ws, "-n", "--config", "corpora=[slimpajama]", "--", "resources/corpora/slimpajama/data_prefix.json", timeout=300)))
    assert full["corpus_preprocess"] == 75 and full["corpus_download"] == 16


def test_invalid_corpus_config_stops_before_any_job(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    path = ws / "config" / "corpora" / "mini_corpus.yaml"
    path.write_text(path.read_text().replace("files_per_chunk: 4", "files_per_chunk: four"))
    proc = run_snakemake(ws, "-n", "--config", "corpora=[mini_corpus]", check=False, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "config/corpora/mini_corpus.yaml" in out and "concat.files_per_chunk" in out


@pytest.mark.slow
def test_mini_corpus_chain_from_a_local_server(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    served = minicorpus.make_mini_corpus(tmp_path / "srv")
    server = minicorpus.serve(served, rate_limited=("/mini/chunk1/part_2.jsonl.zst",))
    try:
        config = ws / "config" / "corpora" / "mini_corpus.yaml"
        config.write_text(config.read_text().replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
        start = time.monotonic()
        run_snakemake(ws, "--cores", "2", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/data_prefix.json",
                      timeout=600)
        chain_seconds = time.monotonic() - start
    finally:
        server.shutdown()
    print(f"miniature chain: {chain_seconds:.1f} s")
    base = ws / MINI
    download = json.loads((base / "download.json").read_text())
    assert download["num_files"] == 9 and download["missing"] == ["mini_chunk2_part3.jsonl.zst"]
    assert "HTTP 429" in (ws / "logs/corpora/mini_corpus/download_0.log").read_text()  # retried, then fetched
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
    # Done is done; a lost chunk is redone alone (no download, no other chunk).
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(
        run_snakemake(ws, "-n", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/data_prefix.json"))
    before = (base / "preprocessed/train_chunk_2_text_document.bin").read_bytes()
    (base / "preprocessed/train_chunk_2_text_document.bin").unlink()
    proc = run_snakemake(ws, "--cores", "2", "--config", "corpora=[mini_corpus]", "--", f"{MINI}/data_prefix.json",
                         *(f"{MINI}/preprocessed/train_chunk_{g}_text_document.bin" for g in range(3)), timeout=300)
    assert planned_jobs(proc.stdout + proc.stderr) == {"corpus_preprocess": 1, "corpus_blend": 1}
    assert (base / "preprocessed/train_chunk_2_text_document.bin").read_bytes() == before
