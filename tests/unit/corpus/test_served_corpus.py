"""The miniature corpus served by the stage itself: written once, served over real HTTP on a free
localhost port while the block runs, the corpus's URLs pointed there, the server gone afterwards."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from mlrepro.corpus import served
from mlrepro.data import http
from workspace import REPO


def mini_corpus() -> dict:
    corpus = yaml.safe_load((REPO / "config" / "corpora" / "mini_corpus.yaml").read_text())
    corpus["served"] = "mini_corpus"
    return corpus


def test_the_stage_serves_the_files_the_corpus_names_and_stops(tmp_path):
    corpus = mini_corpus()
    with served.serving(corpus, tmp_path / "mini_corpus") as live:
        url = live["source"]["url"].format(chunk=1, shard=0)
        assert url.startswith("http://127.0.0.1:") and ":18765/" not in url
        got = http.http_download(url, tmp_path / "got" / "part_0.jsonl.zst")
        assert got.read_bytes() == (tmp_path / "mini_corpus" / "origin" / "mini" / "chunk1" / "part_0.jsonl.zst").read_bytes()
        vocab = http.http_download(live["tokenizer"]["vocab_file"], tmp_path / "got" / "vocab.json")
        assert "<|endoftext|>" in json.loads(vocab.read_text())
        assert "served" not in live  # what a Slurm array task reads is an ordinary corpus
    assert corpus["source"]["url"].startswith("http://127.0.0.1:18765/")  # the configuration is left as it was
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_a_corpus_that_is_not_served_passes_through(tmp_path):
    corpus = {"name": "x", "source": {"url": "https://example.org/{shard}.zst"}}
    with served.serving(corpus, tmp_path) as live:
        assert live is corpus
    assert not (tmp_path / "origin").exists()


def test_the_files_are_written_once_even_by_two_stages_at_once(tmp_path):
    results = []
    threads = [threading.Thread(target=lambda: results.append(served.origin(tmp_path / "origin", "mini_corpus")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = json.loads((tmp_path / "origin" / "origin.json").read_text())
    assert "tokenizer/merges.txt" in made["files"] and len(made["files"]) == 9 + 2
    stamp = (tmp_path / "origin" / "origin.json").stat().st_mtime_ns
    served.origin(tmp_path / "origin", "mini_corpus")
    assert (tmp_path / "origin" / "origin.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="not a corpus mlrepro can write"):
        served.origin(tmp_path / "other", "slimpajama")


def test_only_localhost_urls_are_pointed_at_the_server():
    corpus = {"source": {"urls": ["http://localhost:1/a.zst", "https://cdn.example.org/b.zst"]},
              "tokenizer": {"vocab_file": "http://127.0.0.1:18765/v.json", "merge_file": "tok/merges.txt"},
              "served": "mini_corpus"}
    out = served.pointed_at(corpus, 4242)
    assert out["source"]["urls"] == ["http://127.0.0.1:4242/a.zst", "https://cdn.example.org/b.zst"]
    assert out["tokenizer"] == {"vocab_file": "http://127.0.0.1:4242/v.json", "merge_file": "tok/merges.txt"}


def test_a_paced_server_takes_as_long_as_its_rate_says(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"z" * 40_000)
    server = served.serve(tmp_path, bytes_per_second=100_000)
    try:
        started = time.monotonic()
        got = http.http_download(f"http://127.0.0.1:{server.server_address[1]}/f.bin", tmp_path / "out" / "f.bin")
        took = time.monotonic() - started
    finally:
        server.shutdown()
    assert got.stat().st_size == 40_000 and took >= 0.35
