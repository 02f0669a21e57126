"""The corpus stages, one module at a time, without Snakemake (test_corpus_workflow.py runs the chain)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard

from mlrepro import config as mlrepro_config
from mlrepro.data import checks
from mlrepro.corpus import blend, concat, extract, minicorpus, preprocess, shards
from mlrepro.corpus import tasks as corpus_tasks
from mlrepro.formats import indexed
from mlrepro.launch import array
from mlrepro.stages import corpus as stages
from mlrepro.corpus import tokenizer as corpus_tokenizer
import workspace

REPO = workspace.REPO


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    return minicorpus.train_gpt2_bpe(minicorpus.documents(1500, seed=5), folder, vocab_size=800)


def _options(tmp_path, gpt2_files, jsonl, **kw):
    vocab, merges = gpt2_files
    return preprocess.Options(input=jsonl, output_prefix=str(tmp_path / "out" / "ds"), tokenizer_type="GPT2BPETokenizer",
                              vocab_file=str(vocab), merge_file=str(merges), **kw)


def _sha(prefix):
    import hashlib

    return [hashlib.sha256(Path(f"{prefix}{s}").read_bytes()).hexdigest() for s in (".bin", ".idx")]


# --- indexed ---------------------------------------------------------------------------------

def test_indexed_writer_bytes_follow_megatron_layout(tmp_path):
    w = indexed.IndexedWriter(tmp_path / "d.bin", np.uint16)
    w.add_documents(np.array([5, 6, 7, 8, 9]), np.array([2, 0, 3]))  # middle document empty
    w.add_document([1])
    w.finalize(tmp_path / "d.idx")
    raw = (tmp_path / "d.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<QBQQ", raw, 9) == (1, 8, 3, 5)  # version, uint16 code, 3 sequences, 4 docs + 1
    lengths = np.frombuffer(raw, "<i4", 3, 34)
    pointers = np.frombuffer(raw, "<i8", 3, 34 + 12)
    docs = np.frombuffer(raw, "<i8", 5, 34 + 12 + 24)
    assert lengths.tolist() == [2, 3, 1]
    assert pointers.tolist() == [0, 4, 10]          # bytes, 2 per uint16 token
    assert docs.tolist() == [0, 1, 1, 2, 3]         # the empty document repeats index 1
    assert len(raw) == 34 + 12 + 24 + 40
    assert (tmp_path / "d.bin").read_bytes() == np.array([5, 6, 7, 8, 9, 1], "<u2").tobytes()


def test_indexed_reader_round_trip_and_dtype_choice(tmp_path):
    assert indexed.optimal_dtype(50257) is np.uint16 and indexed.optimal_dtype(128256) is np.int32
    w = indexed.IndexedWriter(tmp_path / "d.bin", np.int32)
    docs = [[70000, 1], [], [2, 3, 4]]
    for d in docs:
        w.add_document(d)
    w.finalize(tmp_path / "d.idx")
    r = indexed.IndexedReader(tmp_path / "d")
    assert r.dtype is np.int32 and len(r) == 2 and r.num_documents == 3
    assert [r.document(i).tolist() for i in range(3)] == docs
    with open(tmp_path / "d.bin", "ab") as fh:
        fh.write(b"\0\0\0\0")
    with pytest.raises(indexed.IndexedFormatError, match="d.bin"):
        indexed.IndexedReader(tmp_path / "d")


def test_megatron_core_reads_what_preprocess_writes(tmp_path, gpt2_files):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    texts = list(minicorpus.documents(120, seed=4))
    texts[3] = ""
    jsonl = minicorpus.write_jsonl(tmp_path / "in.jsonl", texts)
    result = preprocess.preprocess(_options(tmp_path, gpt2_files, jsonl, append_eod=True, workers=2, slice_bytes=2048))
    ours = indexed.IndexedReader(result.outputs["text"])
    theirs = IndexedDataset(result.outputs["text"])
    assert len(theirs) == len(ours) == 119
    assert theirs.document_indices.tolist() == ours.document_indices.tolist()
    assert theirs.document_indices[3] == theirs.document_indices[4]
    assert all(theirs[i].tolist() == ours[i].tolist() for i in range(len(ours)))


def test_writer_refuses_ids_beyond_dtype(tmp_path):
    w = indexed.IndexedWriter(tmp_path / "d.bin", np.uint16)
    with pytest.raises(ValueError, match="does not fit"):
        w.add_document([70000])


# --- tokenizer -------------------------------------------------------------------------------

def test_gigatoken_and_tokenizers_give_transformers_ids(gpt2_files, tmp_path):
    from transformers import GPT2Tokenizer

    vocab, merges = gpt2_files
    texts = list(minicorpus.documents(200, seed=11)) + corpus_tokenizer.PROBE
    reference = GPT2Tokenizer(vocab=str(vocab), merges=str(merges))
    want = [reference(t).input_ids for t in texts]
    fast = corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(vocab), merge_file=str(merges))
    slow = corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(vocab), merge_file=str(merges), use_gigatoken=False)
    assert (fast.backend, slow.backend) == ("gigatoken", "tokenizers")
    for enc in (fast, slow):
        ids, lengths = enc.encode_batch(texts)
        assert np.split(ids, np.cumsum(lengths)[:-1])[5].tolist() == want[5]
        assert [a.tolist() for a in np.split(ids, np.cumsum(lengths)[:-1])] == want
    assert fast.eod == reference.eos_token_id == len(json.loads(vocab.read_text())) - 1
    assert fast.vocab_size == slow.vocab_size == len(reference)


def test_gpt2_backend_is_the_one_transformers_builds(gpt2_files, tmp_path):
    """mlrepro builds GPT-2's `tokenizers` object itself (no transformers import at start): the same JSON."""
    from transformers import GPT2Tokenizer

    vocab, merges = gpt2_files
    ours = json.loads(corpus_tokenizer.gpt2_backend(str(vocab), str(merges)).to_str())
    assert ours == json.loads(GPT2Tokenizer(vocab=str(vocab), merges=str(merges)).backend_tokenizer.to_str())
    # Without <|endoftext|> in the vocabulary transformers adds it; mlrepro then uses transformers.
    words = {k: v for k, v in json.loads(vocab.read_text()).items() if k != corpus_tokenizer.EOD_GPT2}
    (tmp_path / "v.json").write_text(json.dumps(words))
    assert corpus_tokenizer.gpt2_backend(str(tmp_path / "v.json"), str(merges)) is None
    enc = corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(tmp_path / "v.json"), merge_file=str(merges))
    assert enc.eod == GPT2Tokenizer(vocab=str(tmp_path / "v.json"), merges=str(merges)).eos_token_id == len(words)


def test_huggingface_tokenizer_json_matches_gpt2_files(gpt2_files, tmp_path):
    from transformers import GPT2Tokenizer

    vocab, merges = gpt2_files
    GPT2Tokenizer(vocab=str(vocab), merges=str(merges)).backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    hf = corpus_tokenizer.load("HuggingFaceTokenizer", tokenizer_model=str(tmp_path / "tokenizer.json"))
    gpt2 = corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(vocab), merge_file=str(merges))
    texts = list(minicorpus.documents(50, seed=3))
    assert hf.encode_batch(texts)[0].tolist() == gpt2.encode_batch(texts)[0].tolist()


def test_missing_tokenizer_file_is_named(tmp_path, gpt2_files):
    with pytest.raises(corpus_tokenizer.TokenizerError, match="v.json: no such file"):
        corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(tmp_path / "v.json"), merge_file=str(gpt2_files[1]))
    with pytest.raises(corpus_tokenizer.TokenizerError, match="needs --merge-file"):
        corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(gpt2_files[0]))


# --- preprocess ------------------------------------------------------------------------------

def test_preprocess_empty_documents_and_eod(tmp_path, gpt2_files):
    jsonl = minicorpus.write_jsonl(tmp_path / "in.jsonl", ["hello world", "", "a b c"])
    result = preprocess.preprocess(_options(tmp_path, gpt2_files, jsonl, append_eod=True))
    r = indexed.IndexedReader(result.outputs["text"])
    enc = corpus_tokenizer.load("GPT2BPETokenizer", vocab_file=str(gpt2_files[0]), merge_file=str(gpt2_files[1]))
    assert r.num_documents == 3 and len(r) == 2
    assert r.document_indices.tolist() == [0, 1, 1, 2]
    assert r.document(0).tolist() == enc.encode_batch(["hello world"])[0].tolist() + [enc.eod]
    assert r.document(1).tolist() == []


def test_slices_and_workers_do_not_change_the_bytes(tmp_path, gpt2_files):
    jsonl = minicorpus.write_jsonl(tmp_path / "in.jsonl", minicorpus.documents(600, seed=21))
    one = preprocess.preprocess(_options(tmp_path / "a", gpt2_files, jsonl, append_eod=True))
    many = preprocess.preprocess(_options(tmp_path / "b", gpt2_files, jsonl, append_eod=True, workers=2,
                                          slice_bytes=4096))
    forked = preprocess.preprocess(_options(tmp_path / "d", gpt2_files, jsonl, append_eod=True, workers=2,
                                            slice_bytes=4096, pool="process"))
    slow = preprocess.preprocess(_options(tmp_path / "c", gpt2_files, jsonl, append_eod=True, use_gigatoken=False,
                                          workers=2, slice_bytes=8192))
    assert one.documents == 600 and many.backend == "gigatoken" and slow.backend == "tokenizers"
    assert _sha(one.outputs["text"]) == _sha(many.outputs["text"]) == _sha(forked.outputs["text"]) \
        == _sha(slow.outputs["text"])


def test_slices_end_on_line_boundaries(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"a\nbb\nccc\n\ndddd")
    for size in (1, 2, 3, 5, 100):
        parts = list(preprocess.slices(path, size))
        assert b"".join(path.read_bytes()[s:e] for s, e in parts) == path.read_bytes()
        assert all(path.read_bytes()[e - 1:e] == b"\n" for _, e in parts[:-1])


@pytest.mark.parametrize("bad_line, message", [
    (b'{"text": "unterminated', "line 3: not valid JSON"),
    (b'{"title": "no text"}', "line 3: no key 'text'"),
    (b'{"text": "caf\xe9"}', "line 3: not UTF-8 (byte 0xe9"),
    (b'{"text": ["a", "list"]}', "line 3: key 'text' holds list"),
    (b'', "line 3: empty line"),
    (b'[1, 2]', "line 3: not a JSON object"),
])
def test_bad_lines_are_named_and_leave_no_output(tmp_path, gpt2_files, bad_line, message):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_bytes(b'{"text": "one"}\n{"text": "two"}\n' + bad_line + b'\n{"text": "four"}\n')
    for workers in (1, 2):
        with pytest.raises(preprocess.InputError) as err:
            preprocess.preprocess(_options(tmp_path, gpt2_files, jsonl, workers=workers, slice_bytes=20))
        assert f"{jsonl}:{message.split(': ', 1)[0].removeprefix('line ')}: {message.split(': ', 1)[1]}" in str(err.value)
        assert not list((tmp_path / "out").glob("*"))


def test_cli_takes_megatron_flags_and_logs_progress(tmp_path, gpt2_files):
    jsonl = minicorpus.write_jsonl(tmp_path / "in.jsonl", minicorpus.documents(300, seed=8),
                                   key="body")
    vocab, merges = gpt2_files
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "mlrepro", "preprocess", "--input", str(jsonl), "--output-prefix", str(tmp_path / "o"),
         "--json-keys", "body", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab),
         "--merge-file", str(merges), "--append-eod", "--workers", "2", "--log-interval", "0"],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "300 documents" in proc.stderr and "tokens/s" in proc.stderr and "ETA" in proc.stderr
    assert indexed.IndexedReader(tmp_path / "o_body_document").num_documents == 300
    bad = subprocess.run([sys.executable, "-m", "mlrepro", "preprocess", "--input", str(tmp_path / "none.jsonl"),
                          "--output-prefix", str(tmp_path / "p"), "--tokenizer-type", "GPT2BPETokenizer",
                          "--vocab-file", str(vocab), "--merge-file", str(merges)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1 and "none.jsonl: no such file" in bad.stderr


def test_progress_redraws_on_a_terminal():
    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    tty = Tty()
    p = preprocess.Progress(1000, tty)
    p.update(10, 500, 1000, final=True)
    assert tty.text.startswith("\r100.0% 10 documents, 500 tokens") and tty.text.endswith("\n")


# --- shards, download ------------------------------------------------------------------------

def test_slimpajama_shards_and_the_seed_split():
    corpus = mlrepro_config.load_corpus(REPO, "slimpajama")
    all_shards = shards.expand(corpus["source"])
    assert len(all_shards) == 60000
    assert all_shards[6001].name == "example_train_chunk2_shard1.jsonl.zst"
    assert all_shards[6001].source.endswith("/train/chunk2/example_train_1.jsonl.zst")
    # the NeMo guide's split_shards: rank r of w takes [r*n//w, (r+1)*n//w)
    parts = [shards.share(6000, r, 96) for r in range(96)]
    assert parts[0] == range(0, 62) and parts[95] == range(5937, 6000)
    assert sum(len(p) for p in parts) == 6000
    assert len(shards.groups(60000, 800)) == 75 and shards.groups(6000, 800)[-1] == range(5600, 6000)


def test_download_share_skips_complete_files_and_records_holes(tmp_path):
    root = tmp_path / "srv"
    for i in (0, 1, 3):
        (root / f"s{i}.jsonl").parent.mkdir(parents=True, exist_ok=True)
        (root / f"s{i}.jsonl").write_text(f'{{"text": "{i}"}}\n')
    server = minicorpus.serve(root)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s{{i}}.jsonl"
        all_shards = shards.expand({"url": url, "ranges": {"i": [0, 3]}})
        dest = tmp_path / "dl"
        reports = [shards.download_share(all_shards, r, 2, dest, tmp_path / f"t{r}.json", retries=0) for r in (0, 1)]
        assert reports[1]["missing"] == ["s2.jsonl"] and set(reports[0]["files"]) == {"s0.jsonl", "s1.jsonl"}
        (root / "s0.jsonl").write_text("changed on the server\n")
        shards.download_share(all_shards, 0, 2, dest, tmp_path / "t0.json", retries=0)
        assert (dest / "s0.jsonl").read_text() == '{"text": "0"}\n'  # complete file: not fetched again
    finally:
        server.shutdown()
    with pytest.raises(shards.CorpusError, match="s2.jsonl"):
        shards.verify(all_shards, reports, tmp_path / "v.json")
    with pytest.raises(shards.CorpusError, match="3 shards downloaded, expected 4"):
        shards.verify(all_shards, reports, tmp_path / "v.json", expected_files=4)
    record = shards.verify(all_shards, reports, tmp_path / "v.json", expected_files=3)
    assert [s["size"] is None for s in record["shards"]] == [False, False, True, False]
    with pytest.raises(shards.CorpusError, match="at least 4 expected"):
        shards.verify(all_shards, reports, tmp_path / "v.json", min_files=4)


def test_download_checks_the_manifest(tmp_path):
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "a.jsonl").write_text('{"text": "a"}\n')
    server = minicorpus.serve(tmp_path / "srv")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/a.jsonl"
        manifest = {"a.jsonl": {"size": 14, "sha256": "0" * 64}}
        with pytest.raises(shards.CorpusError, match="a.jsonl is corrupt: sha256"):
            shards.download_share(shards.expand({"urls": [url]}), 0, 1, tmp_path / "dl", tmp_path / "t.json",
                                  retries=0, manifest=manifest)
    finally:
        server.shutdown()
    assert not (tmp_path / "dl" / "a.jsonl").exists()


# --- extract, concat, blend ------------------------------------------------------------------

def test_extract_verifies_before_deleting(tmp_path):
    body = b"".join(b'{"text": "%d"}\n' % i for i in range(5000))
    good = tmp_path / "a.jsonl.zst"
    good.write_bytes(zstandard.ZstdCompressor().compress(body))
    cut = tmp_path / "b.jsonl.zst"
    cut.write_bytes(good.read_bytes()[:-40])
    out = tmp_path / "x"
    assert extract.extract_one(good, out, delete_compressed=True).read_bytes() == body
    assert not good.exists()
    with pytest.raises(extract.ExtractError, match="b.jsonl.zst"):
        extract.extract_one(cut, out, delete_compressed=True)
    assert cut.exists() and not (out / "b.jsonl").exists()


def test_concat_is_stable_and_keeps_lines_apart(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b'{"text": "no newline at end"}')
    b.write_bytes(b'{"text": "b"}\n')
    concat.concatenate([a, b], tmp_path / "c1")
    concat.concatenate([a, b], tmp_path / "c2")
    assert (tmp_path / "c1").read_bytes() == (tmp_path / "c2").read_bytes() == a.read_bytes() + b"\n" + b.read_bytes()


def test_blend_weights(tmp_path):
    prefixes = []
    for name, n in (("a", 30), ("b", 10)):
        w = indexed.IndexedWriter(tmp_path / f"{name}.bin")
        w.add_document(list(range(n)))
        w.finalize(tmp_path / f"{name}.idx")
        prefixes.append(str(tmp_path / name))
    record = blend.write_blend(prefixes, tmp_path / "data_prefix.json")
    assert record["data_prefix"] == [0.75, prefixes[0], 0.25, prefixes[1]]
    assert (tmp_path / "data_prefix.txt").read_text().split() == ["0.75", prefixes[0], "0.25", prefixes[1]]
    assert blend.blend(prefixes, "equal")["data_prefix"][::2] == [0.5, 0.5]


# --- config ----------------------------------------------------------------------------------

def test_corpus_config_errors_name_file_and_key(tmp_path):
    (tmp_path / "config" / "corpora").mkdir(parents=True)
    (tmp_path / "workflow").symlink_to(REPO / "workflow")
    bad = {"name": "bad", "source": {"urls": ["http://x/a.jsonl"]}, "tokenizer": {"type": "GPT2BPETokenizer"},
           "concat": {"files_per_chunk": 0}}
    (tmp_path / "config" / "corpora" / "bad.yaml").write_text(json.dumps(bad))
    with pytest.raises(mlrepro_config.ConfigError) as err:
        mlrepro_config.load_corpus(tmp_path, "bad")
    assert "config/corpora/bad.yaml" in str(err.value)
    assert "concat.files_per_chunk" in str(err.value) and "vocab_file" in str(err.value)
    for name in ("slimpajama", "slimpajama_quick", "mini_corpus"):
        assert mlrepro_config.load_corpus(REPO, name)["name"] == name


def test_a_shard_already_extracted_is_not_downloaded_again(tmp_path):
    # The URL points nowhere: a download attempt would fail the task.
    gone = shards.expand({"urls": ["http://127.0.0.1:9/a.jsonl.zst"]})
    report = shards.download_share(gone, 0, 1, tmp_path / "dl", tmp_path / "t.json", retries=0,
                                   already=lambda s: s.name == "a.jsonl.zst")
    assert report["files"] == {"a.jsonl.zst": 0} and report["missing"] == []
    assert shards.verify(gone, [report], tmp_path / "v.json")["num_files"] == 1


# --- bytes_per_chunk -------------------------------------------------------------------------

def test_bytes_per_chunk_groups_by_size_in_a_stable_order(tmp_path):
    sizes = [40, 30, None, 50, 200, 10, 10, 10]
    plan = shards.groups_by_bytes(sizes, 100)
    # 40+30 (+hole) fits, +50 would not; 200 is alone; the tail fits.
    assert plan == [range(0, 3), range(3, 4), range(4, 5), range(5, 8)]
    assert shards.groups_by_bytes(sizes, 100) == plan
    assert sum(len(r) for r in plan) == len(sizes)
    assert all(sum(sizes[p] or 0 for p in r) <= 100 or len([p for p in r if sizes[p]]) == 1 for r in plan)
    # Through the stages: the plan is kept in download.json and the chunks come out byte-identical.
    files = []
    for i, n in enumerate((3, 2, 5, 1)):
        f = tmp_path / "src" / f"s{i}.jsonl"
        minicorpus.write_jsonl(f, minicorpus.documents(n, seed=i))
        files.append(f)
    corpus = {"name": "b", "concat": {"bytes_per_chunk": files[0].stat().st_size + files[1].stat().st_size}}
    chunks = corpus_tasks.chunk_plan(corpus, [f.stat().st_size for f in files])
    assert chunks[0] == range(0, 2) and sum(len(c) for c in chunks) == 4
    outs = []
    for attempt in range(2):
        out = tmp_path / f"c{attempt}.jsonl"
        concat.concatenate([files[p] for p in chunks[0]], out)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == files[0].read_bytes() + files[1].read_bytes()


def test_concat_takes_exactly_one_size_bound(tmp_path):
    (tmp_path / "config" / "corpora").mkdir(parents=True)
    (tmp_path / "workflow").symlink_to(REPO / "workflow")
    base = {"source": {"urls": ["http://x/a.jsonl"]},
            "tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "v", "merge_file": "m"}}
    for name, concat_cfg, ok in (("both", {"files_per_chunk": 2, "bytes_per_chunk": 10}, False),
                                 ("neither", {}, False), ("bytes", {"bytes_per_chunk": 10}, True),
                                 ("absent", None, True)):
        cfg = {"name": name, **base, **({"concat": concat_cfg} if concat_cfg is not None else {})}
        (tmp_path / "config" / "corpora" / f"{name}.yaml").write_text(json.dumps(cfg))
        if ok:
            loaded = mlrepro_config.load_corpus(tmp_path, name)["concat"]
            assert loaded == (concat_cfg or {"files_per_chunk": 800})
        else:
            with pytest.raises(mlrepro_config.ConfigError, match=rf"(?s){name}.yaml.*concat"):
                mlrepro_config.load_corpus(tmp_path, name)


# --- a Hub repository as the source ----------------------------------------------------------

def test_hub_repository_source_with_a_token_by_name(tmp_path, monkeypatch):
    from fixtures.http_server import LocalHTTPServer

    token = "hf_corpusTEST_9c1e7d"
    monkeypatch.setenv("HF_TOKEN", token)
    cctx = zstandard.ZstdCompressor()
    files = {f"train/chunk1/example_train_{i}.jsonl.zst": cctx.compress(b'{"text": "%d"}\n' % i) for i in (0, 1, 3)}
    source = {"hub": {"repo": "org/corpus", "repo_type": "dataset"}, "path": "train/chunk{chunk}/example_train_{shard}.jsonl.zst",
              "name": "c{chunk}_s{shard}.jsonl.zst", "ranges": {"chunk": [1, 1], "shard": [0, 3]}, "token_env": "HF_TOKEN"}
    all_shards = shards.expand(source)
    assert [s.hub_path for s in all_shards][1] == "train/chunk1/example_train_1.jsonl.zst"
    with LocalHTTPServer(require_token=token) as srv:
        srv.add_hub_repo("org/corpus", files, repo_type="dataset")
        hub = {**source["hub"], "endpoint": srv.url("")}
        reports = [shards.download_share(all_shards, r, 2, tmp_path / "dl", tmp_path / f"t{r}.json", workers=2,
                                         token_env="HF_TOKEN", hub=hub) for r in (0, 1)]
        assert all(r.headers.get("authorization") == f"Bearer {token}" for r in srv.requests)
        asked = len(srv.requests)
        shards.download_share(all_shards, 0, 2, tmp_path / "dl", tmp_path / "t0.json", token_env="HF_TOKEN", hub=hub)
        assert len(srv.requests) == asked  # complete shards: no request at all
        monkeypatch.delenv("HF_TOKEN")
        with pytest.raises(checks.MissingTokenError, match="HF_TOKEN"):
            shards.download_share(all_shards, 1, 2, tmp_path / "dl2", tmp_path / "t.json", token_env="HF_TOKEN", hub=hub)
    assert reports[1]["missing"] == ["c1_s2.jsonl.zst"]
    assert (tmp_path / "dl" / "c1_s3.jsonl.zst").read_bytes() == files["train/chunk1/example_train_3.jsonl.zst"]
    record = shards.verify(all_shards, reports, tmp_path / "v.json", expected_files=3)
    assert record["num_files"] == 3
    written = "\n".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.json"))
    assert token not in written


# --- the array of tasks ----------------------------------------------------------------------

def test_array_indices_script_and_local_tasks(tmp_path):
    assert array.indices_text([0, 1, 2, 3]) == "0-3" and array.indices_text([7, 3, 8, 9, 12]) == "3,7-9,12"
    plan = array.ArrayPlan("c", "download", 16, tmp_path / "c", cpus=1, task_module="mlrepro.corpus.tasks")
    line = array.sbatch_request(plan, [3, 7], tmp_path, "debug", None).render()
    assert "--array=3,7" in line and "--wait" in line and "--partition=debug" in line
    assert line[-1] == str(plan.script)
    array.write_script(plan, {"name": "c"}, tmp_path)
    script = plan.script.read_text()
    assert "RANK=$SLURM_ARRAY_TASK_ID WORLD_SIZE=16" in script and "-m mlrepro.corpus.tasks download" in script
    assert json.loads(plan.spec.read_text()) == {"name": "c"}
    ran = []
    array.run_local(plan, [0, 2], ran.append, parallel=2)
    assert sorted(ran) == [0, 2]

    def flaky(i):
        if i == 1:
            raise RuntimeError("boom")

    with pytest.raises(array.ArrayError, match="task 1: boom"):
        array.run_local(plan, [0, 1, 2], flaky, parallel=3)
    with pytest.raises(array.ArrayError, match=r"task\(s\) 2 of 16.*download_task_2.log"):
        array.check_outputs(plan, tmp_path, [1, 2], lambda i: i == 1, "42", "")


def test_stage_tasks_already_done_are_not_run_again(tmp_path):
    """Resumable per task: a download share reported under the same WORLD_SIZE, a chunk whose pair is
    newer than the chunk. Anything else runs (here: locally, as without Slurm)."""
    corpus = {"name": "c", "json_keys": ["text"], "download": {"array_tasks": 3}, "preprocess": {"workers": 1}}
    base = tmp_path / "resources/corpora/c"
    (base / "download").mkdir(parents=True)
    (base / "download/task_0.json").write_text(json.dumps({"world": 3, "files": {}, "missing": []}))
    (base / "download/task_1.json").write_text(json.dumps({"world": 4, "files": {}, "missing": []}))
    ran = []
    stages.run_tasks(corpus, tmp_path, None, "download", 3, lambda r: corpus_tasks.task_done(corpus, tmp_path, r),
                      ran.append, parallel=3)
    assert sorted(ran) == [1, 2]
    (base / "concat").mkdir()
    (base / "preprocessed").mkdir()
    for g in (0, 1):
        (base / f"concat/train_chunk_{g}.jsonl").write_text("{}\n")
        for s in (".bin", ".idx"):
            (base / f"preprocessed/train_chunk_{g}_text_document{s}").write_bytes(b"")
    os.utime(base / "concat/train_chunk_1.jsonl", (time.time() + 5, time.time() + 5))  # concatenated again
    ran.clear()
    stages.run_tasks(corpus, tmp_path, None, "preprocess", 3, lambda g: corpus_tasks.chunk_done(corpus, tmp_path, g),
                      ran.append, parallel=1)
    assert ran == [1, 2]


def test_hub_source_in_the_schema(tmp_path):
    (tmp_path / "config" / "corpora").mkdir(parents=True)
    (tmp_path / "workflow").symlink_to(REPO / "workflow")
    tok = {"type": "GPT2BPETokenizer", "vocab_file": "v", "merge_file": "m"}
    hub = {"hub": {"repo": "cerebras/SlimPajama-627B"}, "path": "train/chunk{chunk}/example_train_{shard}.jsonl.zst",
           "ranges": {"chunk": [1, 1], "shard": [0, 9]}, "token_env": "HF_TOKEN"}
    for name, source, ok in (("good", hub, True), ("also_urls", {**hub, "urls": ["http://x/a"]}, False),
                             ("no_path", {"hub": hub["hub"]}, False), ("bad_repo", {**hub, "hub": {"repo": "x"}}, False)):
        (tmp_path / "config" / "corpora" / f"{name}.yaml").write_text(json.dumps({"name": name, "source": source,
                                                                                 "tokenizer": tok}))
        if ok:
            loaded = mlrepro_config.load_corpus(tmp_path, name)
            assert loaded["source"]["hub"]["repo_type"] == "dataset"
            assert len(shards.expand(loaded["source"])) == 10
        else:
            with pytest.raises(mlrepro_config.ConfigError, match=rf"(?s){name}.yaml.*source"):
                mlrepro_config.load_corpus(tmp_path, name)
