"""Inputs not to be trusted: Megatron-LM logs and MLLOG runs that must not score, corpus shards and
Megatron's indexed files cut short or corrupt, config files and values that must be refused, and the
preprocess step's bad input, each named rather than a traceback. Each defect reproduced as it was
found on main 8e72406 (every test here failed there)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zstandard

import logs_factory as lf
from mlrepro import config, paths
from mlrepro.corpus import extract, minicorpus, shards, tasks
from mlrepro.formats import indexed
from mlrepro.kinds import systems
from mlrepro.scoring import megatron_score
from mlrepro.scoring import score as scoring
from mlrepro.scoring.rules import rules_for

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "megatron"
SDPA = FIX / "megatron_sdpa.log"
UNFUSED = FIX / "megatron_unfused.log"
MINI_LORA_RUN = REPO / "implementations" / "mini_lora" / "reference" / "result_0.txt"




# ---------------------------------------------------------------- Megatron-LM logs

TARGET = 4.5  # the fixture's first validation (iteration 100) reaches it
START_LINE = re.compile(r"^\[before the start of training step\] datetime:.*\n", re.M)
ITER_LINE = re.compile(r"^ \[\d{4}-.*\] iteration +\d+/ +\d+ \|.*\n", re.M)


def megatron_record(tmp_path, text: str, name="run.log") -> dict:
    path = tmp_path / name
    path.write_text(text)
    return megatron_score.score_training_log(path, target_loss=TARGET)


def megatron_valid(records: list[dict]) -> dict:
    rules = rules_for("gpt_126m", target="lm_loss<=4.5", required_runs=len(records))
    return scoring.score_runs([], rules, runs=records)


def test_a_megatron_reference_log_counts(tmp_path):
    """The unedited fixture is a counted run: what the tests below break is what they edited."""
    rec = megatron_record(tmp_path, SDPA.read_text())
    assert rec["counted"] and rec["converged"] and rec["minutes"] > 0, rec["reasons"]


@pytest.mark.parametrize("stamp", [None, "2026-11-23 23:59:57.000000"], ids=["moved", "moved-and-restamped"])
def test_a_megatron_start_after_the_last_iteration_is_not_a_negative_score(tmp_path, stamp):
    text = SDPA.read_text()
    start = START_LINE.search(text).group(0)
    last = list(ITER_LINE.finditer(text))[-1]
    moved = text.replace(start, "")
    at = moved.index(last.group(0)) + len(last.group(0))
    if stamp:  # written when it stands: after the last iteration
        start = f"[before the start of training step] datetime: {stamp} \n"
    rec = megatron_record(tmp_path, moved[:at] + start + moved[at:])
    assert not rec["counted"] and rec["minutes"] is None
    assert any("start of training" in r for r in rec["reasons"]), rec["reasons"]
    assert not megatron_valid([rec])["valid"]


def test_two_megatron_runs_in_one_log_are_not_one_run(tmp_path):
    rec = megatron_record(tmp_path, SDPA.read_text() + UNFUSED.read_text())
    assert not rec["counted"]
    assert any("more than one run" in r for r in rec["reasons"]), rec["reasons"]


def test_a_megatron_restart_from_iteration_1_in_the_same_log(tmp_path):
    text = SDPA.read_text()
    iters = "".join(m.group(0) for m in ITER_LINE.finditer(text))
    rec = megatron_record(tmp_path, text + iters)
    assert not rec["counted"]
    assert any("more than one run" in r or "goes back" in r for r in rec["reasons"]), rec["reasons"]


def test_shuffled_megatron_iteration_lines(tmp_path):
    text = SDPA.read_text()
    lines = [m.group(0) for m in ITER_LINE.finditer(text)]
    shuffled = text
    # swap the 3rd and the 20th iteration lines (both before the last validation)
    shuffled = shuffled.replace(lines[2], "\x00A").replace(lines[19], lines[2]).replace("\x00A", lines[19])
    rec = megatron_record(tmp_path, shuffled)
    assert not rec["counted"]
    assert any("order" in r or "goes back" in r for r in rec["reasons"]), rec["reasons"]


@pytest.mark.parametrize("loss", ["-1.000000E+00", "0.000000E+00"])
def test_an_impossible_megatron_validation_loss_reaches_no_target(tmp_path, loss):
    text = SDPA.read_text().replace("lm loss value: 4.414262E+00", f"lm loss value: {loss}")
    rec = megatron_record(tmp_path, text)
    assert rec["iteration_to_converge"] != 100
    assert any("validation" in p and "iteration 100" in p for p in rec["problems"] + rec["reasons"])


def test_a_megatron_run_converged_without_a_time_is_not_converged(tmp_path):
    rec = megatron_record(tmp_path, START_LINE.sub("", SDPA.read_text()))
    assert rec["minutes"] is None
    assert rec["converged"] is False and not rec["counted"]


def test_score_runs_refuses_a_megatron_record_without_a_positive_time(tmp_path):
    """score_runs trusts no record's time: one read back from a run.json written by an older version."""
    good = megatron_record(tmp_path, SDPA.read_text())
    records = [dict(good, seed=1), dict(good, seed=2, minutes=-268.141), dict(good, seed=3, minutes=float("nan")),
               dict(good, seed=4, minutes=None)]
    result = megatron_valid(records)
    assert not result["valid"] and result["runs_counted"] == 1
    for r in result["runs"][1:]:
        assert not r["counted"]


# ---------------------------------------------------------------- MLLOG

def mini_lora_rules(runs=3):
    return rules_for("mini_lora", target="eval_accuracy<=0.925", required_runs=runs)


def with_seed(text: str, seed) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        if '"key": "seed"' in line:
            if seed is None:
                continue
            line = re.sub(r'"value": \d+', f'"value": {seed}', line)
        out.append(line)
    return "".join(out)


def score_copies(tmp_path, texts, rules, **kw):
    logs = []
    for i, text in enumerate(texts):
        p = tmp_path / f"result_{i}.txt"
        p.write_text(text)
        logs.append(p)
    return scoring.score_runs(logs, rules, run_compliance=False, **kw)


@pytest.mark.parametrize("seeds", [(101, 102, 103), (101, None, None)], ids=["seeds-edited", "seed-dropped"])
def test_an_mllog_run_copied_with_its_seed_edited_is_one_run(tmp_path, seeds):
    base = MINI_LORA_RUN.read_text()
    result = score_copies(tmp_path, [with_seed(base, s) for s in seeds], mini_lora_rules())
    assert not result["valid"]
    dups = [r for r in result["runs"] if r["duplicate"]]
    assert len(dups) == 2
    # The official tools do not look for this: the reason says mlrepro is stricter.
    assert all("stricter than" in " ".join(r["reasons"]) for r in dups), [r["reasons"] for r in dups]


@pytest.mark.parametrize("compliance", [False, True], ids=["generic", "official-checker-passing"])
def test_llama2_mllog_copies_with_edited_seeds(tmp_path, compliance):
    base = lf.run_text(seed=7, minutes=21.5)
    logs = []
    for i in range(10):
        logs.append(tmp_path / f"result_{i}.txt")
        logs[-1].write_text(with_seed(base, 100 + i))
    result = scoring.score_runs(logs, rules_for("llama2_70b_lora"), run_compliance=compliance)
    if compliance:  # the official checker finds nothing wrong with any copy
        assert all(r["compliance"]["pass"] for r in result["runs"]), [r["compliance"] for r in result["runs"]]
    assert not result["valid"]
    assert sum(r["duplicate"] for r in result["runs"]) == 9


def test_distinct_mllog_runs_with_the_same_curve_shape_are_not_duplicates(tmp_path):
    """Guard: runs that differ in their times are distinct even when their evaluations agree."""
    texts = [lf.run_text("mini_lora", seed=100 + i, minutes=10 + i) for i in range(3)]
    rules = rules_for("mini_lora", target="eval_accuracy<=2.5", required_runs=3)
    result = score_copies(tmp_path, texts, rules)
    assert not any(r["duplicate"] for r in result["runs"]), [r["reasons"] for r in result["runs"]]
    assert result["valid"], result["reasons"]


def retimed(text: str, key: str, time_ms) -> str:
    def edit(line):
        if f'"key": "{key}"' in line:
            return re.sub(r'"time_ms": [-0-9.e+]+', f'"time_ms": {time_ms}', line)
        return line
    return "".join(edit(line) for line in text.splitlines(keepends=True))


@pytest.mark.parametrize("key, time_ms", [("run_stop", "1e300"), ("run_start", "-1000"), ("run_start", "0"),
                                          ("run_stop", "1e15")])
def test_impossible_mllog_timestamps(tmp_path, key, time_ms):
    p = tmp_path / "result_0.txt"
    p.write_text(retimed(MINI_LORA_RUN.read_text(), key, time_ms))
    run = scoring.score_run(p, mini_lora_rules(1), run_compliance=False)
    assert not run["counted"] and run["minutes"] is None
    assert any("time" in r for r in run["reasons"]), run["reasons"]


def test_an_mllog_target_reaching_eval_stamped_after_run_stop(tmp_path):
    text = MINI_LORA_RUN.read_text()
    stop = next(json.loads(line.split(":::MLLOG", 1)[1]) for line in text.splitlines() if '"key": "run_stop"' in line)
    evals = [line for line in text.splitlines(keepends=True) if '"key": "eval_accuracy"' in line]
    hit = next(line for line in evals if json.loads(line.split(":::MLLOG", 1)[1])["value"] <= 0.925)
    late = re.sub(r'"time_ms": \d+', f'"time_ms": {stop["time_ms"] + 60_000}', hit)
    text = text.replace(hit, late)
    # only the hitting evals after it (if any) are removed, so the late one is the only hit
    for line in evals[evals.index(hit) + 1:]:
        text = text.replace(line, "")
    p = tmp_path / "result_0.txt"
    p.write_text(text)
    run = scoring.score_run(p, mini_lora_rules(1), run_compliance=False)
    assert not run["counted"]
    assert any("after run_stop" in r for r in run["reasons"] + run["problems"]), run["reasons"]


# ---------------------------------------------------------------- corpus shards: extract

def multi_frame(tmp_path, frames=6, lines_per_frame=2000) -> tuple[Path, bytes]:
    plain = b""
    packed = b""
    cctx = zstandard.ZstdCompressor(level=3)
    for f in range(frames):
        chunk = b"".join(b'{"text": "frame %d line %d %s"}\n' % (f, i, b"x" * (i % 50)) for i in range(lines_per_frame))
        plain += chunk
        packed += cctx.compress(chunk)
    src = tmp_path / "shard.jsonl.zst"
    src.write_bytes(packed)
    return src, plain


def test_a_whole_multi_frame_shard_extracts(tmp_path):
    src, plain = multi_frame(tmp_path)
    (tmp_path / "out").mkdir()
    out = extract.extract_one(src, tmp_path / "out", delete_compressed=True)
    assert out.read_bytes() == plain and not src.exists()


def test_a_shard_truncated_in_a_later_frame_is_refused_and_kept(tmp_path):
    src, plain = multi_frame(tmp_path)
    data = src.read_bytes()
    src.write_bytes(data[: len(data) * 2 // 3])  # inside a later frame, not the first
    (tmp_path / "out").mkdir()
    with pytest.raises(extract.ExtractError, match=re.escape(str(src))):
        extract.extract_one(src, tmp_path / "out", delete_compressed=True)
    assert src.exists(), "the truncated shard was deleted"
    assert not (tmp_path / "out" / "shard.jsonl").exists(), "a partial extract was left as if complete"


def test_a_shards_verify_checks_every_frame(tmp_path):
    src, _ = multi_frame(tmp_path)
    data = src.read_bytes()
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(data[:-7])
    with pytest.raises(extract.ExtractError):
        extract.decompress(cut, tmp_path / "cut.jsonl")


def corpus_with_one_shard(tree: Path, source: dict) -> dict:
    path = tree / "config" / "corpora" / "mini_corpus.yaml"
    data = yaml.safe_load(path.read_text())
    data["source"] = source
    data["expected"] = {"files": 1}
    path.write_text(yaml.safe_dump(data))
    corpus = config.load_corpus(tree, "mini_corpus")
    (paths.corpus_dir(tree, "mini_corpus") / "shards").mkdir(parents=True)
    return corpus


def downloaded_record(tree: Path, name: str, size: int) -> Path:
    record = tree / "downloaded.json"
    record.write_text(json.dumps({"shards": [{"position": 0, "name": name, "size": size}], "chunks": [[0, 1]]}))
    return record


def test_a_truncated_downloaded_shard_is_downloaded_again(tree):
    from fixtures.http_server import LocalHTTPServer
    src, plain = multi_frame(tree)
    whole = src.read_bytes()
    with LocalHTTPServer() as server:
        server.add_file("/c/part_0.jsonl.zst", whole)
        corpus = corpus_with_one_shard(tree, {"url": server.url("/c/part_{shard}.jsonl.zst"), "ranges": {"shard": [0, 0]}})
        shard = paths.corpus_dir(tree, "mini_corpus") / "shards" / "part_0.jsonl.zst"
        shard.write_bytes(whole[: len(whole) * 2 // 3])  # an earlier download that ended early
        out = tree / "group_0.json"
        tasks.extract_group(corpus, tree, downloaded_record(tree, shard.name, len(whole)), 0, out)
        assert len(server.requests_to("/c/part_0.jsonl.zst")) >= 1
    extracted = paths.corpus_dir(tree, "mini_corpus") / "extracted" / "part_0.jsonl"
    assert extracted.read_bytes() == plain
    assert json.loads(out.read_text())["files"][0]["size"] == len(plain)


def test_a_truncated_local_shard_is_named_and_kept(tree):
    local = tree / "mine"
    local.mkdir()
    src, _ = multi_frame(local)
    data = src.read_bytes()
    src.write_bytes(data[: len(data) * 2 // 3])
    corpus = corpus_with_one_shard(tree, {"folder": str(local), "glob": "*.zst"})
    shards.fetch_shard(shards.expand(corpus["source"], tree)[0],
                       paths.corpus_dir(tree, "mini_corpus") / "shards" / src.name,
                       retries=0, token=None, expected=None)
    with pytest.raises(extract.ExtractError, match="truncated"):
        tasks.extract_group(corpus, tree, downloaded_record(tree, src.name, len(data)), 0, tree / "g.json")
    assert src.read_bytes() == data[: len(data) * 2 // 3]


# ---------------------------------------------------------------- indexed reader

def small_dataset(tmp_path) -> Path:
    prefix = tmp_path / "ds"
    w = indexed.IndexedWriter(f"{prefix}.bin", np.uint16)
    for doc in ([1, 2, 3], [], [4, 5], [6]):
        w.add_document(doc)
    w.finalize(f"{prefix}.idx")
    return prefix


def corrupt_idx(prefix: Path, edit) -> Path:
    idx = Path(f"{prefix}.idx")
    raw = bytearray(idx.read_bytes())
    idx.write_bytes(bytes(edit(raw)))
    return idx


SEQ = 3  # sequences in small_dataset
DOCS = 5  # document indices in small_dataset
LENGTHS_AT = 34
POINTERS_AT = LENGTHS_AT + 4 * SEQ
DOC_AT = POINTERS_AT + 8 * SEQ


def put(raw, at, fmt, value):
    import struct
    struct.pack_into(fmt, raw, at, value)
    return raw


@pytest.mark.parametrize("name, edit", [
    ("truncated-header", lambda raw: raw[:20]),
    ("truncated-counts", lambda raw: raw[:30]),
    ("truncated-arrays", lambda raw: raw[:DOC_AT + 4]),
    ("huge-sequence-count", lambda raw: put(raw, 18, "<Q", 2**62)),
    ("pointer-off", lambda raw: put(raw, POINTERS_AT + 8, "<q", 2)),
    ("pointer-past-end", lambda raw: put(raw, POINTERS_AT + 16, "<q", 10_000)),
    ("negative-length", lambda raw: put(put(raw, LENGTHS_AT, "<i", -1), LENGTHS_AT + 4, "<i", 5)),
    ("document-index-back", lambda raw: put(raw, DOC_AT + 16, "<q", 0)),
    ("document-index-past-sequences", lambda raw: put(raw, DOC_AT + 32, "<q", 9)),
    ("document-index-not-from-0", lambda raw: put(raw, DOC_AT, "<q", 1)),
])
def test_a_corrupt_megatron_index_is_refused_naming_the_file(tmp_path, name, edit):
    prefix = small_dataset(tmp_path)
    idx = corrupt_idx(prefix, edit)
    with pytest.raises(indexed.IndexedFormatError) as err:
        r = indexed.IndexedReader(prefix)
        # a reader that accepted it must at least not hand out wrong tokens silently
        [r[i] for i in range(len(r))], [r.document(d) for d in range(r.num_documents)]
    assert str(idx) in str(err.value) or str(Path(f"{prefix}.bin")) in str(err.value)


def test_a_missing_bin_names_the_file(tmp_path):
    prefix = small_dataset(tmp_path)
    Path(f"{prefix}.bin").unlink()
    with pytest.raises(indexed.IndexedFormatError, match=re.escape(f"{prefix}.bin")):
        indexed.IndexedReader(prefix)


@pytest.mark.parametrize("which", ["idx", "bin"])
def test_an_indexed_dataset_fifo_is_refused_without_blocking(tmp_path, which):
    prefix = small_dataset(tmp_path)
    target = Path(f"{prefix}.{which}")
    target.unlink()
    os.mkfifo(target)
    code = "from mlrepro.formats import indexed\n"
    code += (f"try:\n    indexed.IndexedReader({str(prefix)!r})\nexcept indexed.IndexedFormatError as e:\n"
             f"    print('REFUSED', e)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    except subprocess.TimeoutExpired:
        pytest.fail(f"IndexedReader blocked on a FIFO {target}")
    assert "REFUSED" in out.stdout and str(target) in out.stdout, out.stdout + out.stderr


def test_the_index_reader_accepts_what_the_writer_writes(tmp_path):
    r = indexed.IndexedReader(small_dataset(tmp_path))
    assert [r.document(d).tolist() for d in range(r.num_documents)] == [[1, 2, 3], [], [4, 5], [6]]


# ---------------------------------------------------------------- config files and values

BENCH = Path("config") / "benchmarks" / "mini_lora.yaml"
SYSTEM = Path("config") / "systems" / "local.yaml"
BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x, x]"]
                 + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
                    for i in range(8)])  # 9 lines, 10^9 leaves


def base_config():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def set_keys(path: Path, **changes):
    data = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path.write_text(yaml.safe_dump(data))


def load_error(tree, cfg=None) -> str:
    with pytest.raises(config.ConfigError) as err:
        config.load(cfg or base_config(), tree)
    return str(err.value)


def refused_within(seconds: float, code: str) -> str:
    """Run `code` in a fresh interpreter; what it printed, failing if it takes longer than `seconds`."""
    start = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {seconds} s (a YAML alias bomb is expanded)")
    assert out.returncode == 0, out.stderr[-3000:]
    assert time.monotonic() - start < seconds
    return out.stdout


@pytest.mark.parametrize("where", ["config.yaml", "benchmark-unknown-key", "system-submission"])
def test_a_yaml_alias_bomb_is_refused_fast(tree, where):
    if where == "config.yaml":
        target = tree / "config" / "config.yaml"
        target.write_text(target.read_text() + BOMB + "\n")
        call = f"config.check_config_file({str(target)!r})"
    elif where == "benchmark-unknown-key":
        target = tree / BENCH
        target.write_text(target.read_text() + BOMB + "\n")
        call = f"config.load({base_config()!r}, {str(tree)!r})"
    else:
        target = tree / SYSTEM
        indented = "\n".join("  " + line for line in BOMB.splitlines())
        target.write_text(target.read_text() + "submission:\n" + indented + "\n")
        call = f"config.load({base_config()!r}, {str(tree)!r})"
    out = refused_within(15, f"from mlrepro import config\ntry:\n    {call}\n    print('ACCEPTED')\n"
                             f"except config.ConfigError as e:\n    print('REFUSED', e)\n")
    assert out.startswith("REFUSED") and target.name in out and "alias" in out, out[:2000]


def test_a_recursive_yaml_alias_is_refused(tree):
    target = tree / SYSTEM
    target.write_text(target.read_text() + "submission: &s {self: *s}\n")
    msg = load_error(tree)
    assert "local.yaml" in msg and "alias" in msg


@pytest.mark.parametrize("which", ["config.yaml", "benchmark", "system"])
def test_a_non_utf8_byte_in_a_config_file_names_the_file(tree, which):
    path = {"config.yaml": tree / "config" / "config.yaml", "benchmark": tree / BENCH, "system": tree / SYSTEM}[which]
    path.write_bytes(path.read_bytes() + b"# caf\xe9\n")
    with pytest.raises(config.ConfigError) as err:
        if which == "config.yaml":
            config.check_config_file(path)
        else:
            config.load(base_config(), tree)
    assert path.name in str(err.value) and "UTF-8" in str(err.value)


@pytest.mark.parametrize("key, value", [("required_runs", 3.0), ("seeds", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]),
                                        ("retries", 1.0)])
def test_a_count_written_as_a_float_is_refused(tree, key, value):
    set_keys(tree / BENCH, **{key: value})
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and key in msg and "integer" in msg


def test_nodes_as_a_float_is_refused(tree):
    set_keys(tree / SYSTEM, nodes=1.0)
    msg = load_error(tree)
    assert "local.yaml" in msg and "nodes" in msg and "integer" in msg


@pytest.mark.parametrize("path, key, value", [
    (BENCH, "retries", 1_000_000_000),
    (SYSTEM, "slurm__poll_seconds", 1e-300),
    (SYSTEM, "slurm__poll_seconds", 0),
])
def test_absurd_numbers_are_refused(tree, path, key, value):
    set_keys(tree / path, **{key: value})
    msg = load_error(tree)
    assert path.name in msg and key.split("__")[-1] in msg


def test_an_empty_config_file_is_named(tree):
    path = tree / "config" / "config.yaml"
    path.write_text("")
    with pytest.raises(config.ConfigError, match=re.escape(str(path))):
        config.check_config_file(path)


@pytest.mark.parametrize("key", ["A=B", "HAS SPACE", "NUL\x00", "", "1LEADING_DIGIT"])
def test_run_env_keys_that_no_environment_can_hold(tree, key):
    data = yaml.safe_load((tree / BENCH).read_text())
    data.setdefault("run_env", {})[key] = "x"
    (tree / BENCH).write_text(yaml.safe_dump(data))
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and "run_env" in msg


def test_a_nul_byte_in_an_env_value(tree):
    data = yaml.safe_load((tree / BENCH).read_text())
    data["env"] = {"GOOD_NAME": "a\x00b"}
    (tree / BENCH).write_text(yaml.safe_dump(data))
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and "env" in msg


@pytest.mark.parametrize("submitter", ["../../x", "", "two\nlines", "a/b", ".hidden", " padded"])
def test_a_submitter_that_is_no_folder_name(tree, submitter):
    msg = load_error(tree, {**base_config(), "submitter": submitter})
    assert "submitter" in msg and "config.yaml" in msg


@pytest.mark.parametrize("script", ["../../../../../bin/true", "/bin/true", "scripts/../../x.py"])
def test_a_dataset_script_outside_the_implementation(tree, script):
    data = yaml.safe_load((tree / BENCH).read_text())
    data["dataset"]["sources"][0]["script"] = script
    (tree / BENCH).write_text(yaml.safe_dump(data))
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and "dataset.sources[0].script" in msg and "outside" in msg


def test_a_script_link_out_of_the_implementation(tree):
    impl = tree / "implementations" / "mini_lora" / "scripts"
    (impl / "escape.py").symlink_to("/bin/true")
    data = yaml.safe_load((tree / BENCH).read_text())
    data["dataset"]["sources"][0]["script"] = "scripts/escape.py"
    (tree / BENCH).write_text(yaml.safe_dump(data))
    assert "outside" in load_error(tree)


def test_a_system_whose_name_is_not_its_file(tree):
    set_keys(tree / SYSTEM, name="other")
    msg = load_error(tree)
    assert "local.yaml" in msg and "name" in msg and "other" in msg


def test_an_unknown_ruleset_is_refused_before_any_job(tree):
    """At parse time: the check every input function makes of its benchmark (kinds.systems.check)."""
    set_keys(tree / BENCH, ruleset="9.9.9")
    settings = config.load(base_config(), tree)
    with pytest.raises(config.ConfigError) as err:
        systems.check(settings, "mini_lora")
    msg = str(err.value)
    assert "mini_lora.yaml" in msg and "ruleset" in msg and "9.9.9" in msg and "5.0.0" in msg


def test_a_target_that_contradicts_the_implementation(tree):
    set_keys(tree / BENCH, target__value=0.5)
    settings = config.load(base_config(), tree)
    with pytest.raises(config.ConfigError) as err:
        systems.check(settings, "mini_lora")
    msg = str(err.value)
    assert "mini_lora.yaml" in msg and "TARGET_EVAL_LOSS" in msg and "0.925" in msg


@pytest.mark.slow
def test_a_stray_benchmark_file_name_breaks_no_target(tmp_path):
    from workspace import make_workspace, run_snakemake

    work = make_workspace(tmp_path / "w")
    (work / "config" / "benchmarks" / "mini(.yaml").write_text("name: x\n")
    proc = run_snakemake(work, "-n", "--profile", "profiles/local", "results/mini_lora/score.json", timeout=300,
                         check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_a_key_given_twice_on_the_command_line(tmp_path):
    from workspace import make_workspace, run_snakemake

    work = make_workspace(tmp_path / "w")
    proc = run_snakemake(work, "-n", "--profile", "profiles/local", "--config", "system=local", "system=local-slurm",
                         timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "--config: key 'system' is given twice" in out, out[-3000:]


# ---------------------------------------------------------------- mlrepro preprocess

@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    return minicorpus.train_gpt2_bpe(minicorpus.documents(300, seed=5), folder, vocab_size=400)


def run_preprocess(tmp_path, gpt2_files, data: bytes, prefix=None, vocab=None):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(data)
    args = ["preprocess", "--input", str(inp), "--output-prefix", str(prefix or tmp_path / "out" / "ds"),
            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab or gpt2_files[0]),
            "--merge-file", str(gpt2_files[1]), "--workers", "1"]
    return subprocess.run([sys.executable, "-m", "mlrepro", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})


@pytest.mark.parametrize("bad, word", [(b'{"text": "\\ud800"}', "surrogate"),
                                       (b"[" * 100_000, "nested"),
                                       (b'{"text": "ok", "deep": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested")],
                         ids=["lone-surrogate", "deep-array", "deep-value"])
def test_preprocess_names_a_bad_line_not_a_traceback(tmp_path, gpt2_files, bad, word):
    proc = run_preprocess(tmp_path, gpt2_files, b'{"text": "fine"}\n' + bad + b"\n")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{tmp_path / 'in.jsonl'}:2:" in proc.stderr and word in proc.stderr
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("make_prefix", [
    lambda t: t / "afile" / "ds",          # a file where a folder should be
    lambda t: Path("/proc/no-such-folder/ds"),
    lambda t: t / "dangling" / "ds",       # a link to nowhere
], ids=["parent-is-a-file", "proc", "dangling-link"])
def test_preprocess_names_an_unwritable_output_prefix(tmp_path, gpt2_files, make_prefix):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "deeper")
    prefix = make_prefix(tmp_path)
    proc = run_preprocess(tmp_path, gpt2_files, b'{"text": "fine"}\n', prefix=prefix)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--output-prefix" in proc.stderr and str(prefix) in proc.stderr


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"a": "b"}', b"\xff\xfe"],
                         ids=["not-json", "a-list", "no-merges-match", "not-utf8"])
def test_preprocess_names_a_corrupt_vocab_file(tmp_path, gpt2_files, content):
    vocab = tmp_path / "vocab.json"
    vocab.write_bytes(content)
    proc = run_preprocess(tmp_path, gpt2_files, b'{"text": "fine"}\n', vocab=vocab)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert str(vocab) in proc.stderr


# ---------------------------------------------------------------- config paths that leave their folder

def test_an_implementation_config_name_that_leaves_its_folder(tree):
    set_keys(tree / SYSTEM, implementation_configs={"mini_lora": "config_x/../../../../bin/evil.sh"})
    msg = load_error(tree)
    assert "local.yaml" in msg and "implementation_configs" in msg


def test_a_git_folder_that_leaves_the_repository(tree):
    data = yaml.safe_load((tree / BENCH).read_text())
    data["implementation"] = {"git": {"url": "https://example.invalid/x.git", "commit": "0" * 40,
                                      "folder": "../../../etc"}}
    (tree / BENCH).write_text(yaml.safe_dump(data))
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and "implementation.git.folder" in msg and "outside" in msg


@pytest.mark.parametrize("cleanup", [{"remove": ["../../../important"]}, {"remove": ["/etc/passwd"]},
                                     {"unwrap": {"model": "../../x"}}])
def test_a_cleanup_that_removes_outside_its_folder(tree, cleanup):
    data = yaml.safe_load((tree / BENCH).read_text())
    data["checkpoint"]["sources"][0]["cleanup"] = cleanup
    (tree / BENCH).write_text(yaml.safe_dump(data))
    msg = load_error(tree)
    assert "mini_lora.yaml" in msg and "checkpoint.sources[0].cleanup" in msg


# Issue 37, item 5: a source that is not a regular file. The guard is a signal, so that a
# regression fails this test instead of hanging the run in open().
@pytest.mark.timeout(20, method="signal")
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_extract_refuses_a_source_that_is_not_a_regular_file(tmp_path, kind):
    src = tmp_path / "shard.jsonl.zst"
    os.mkfifo(src) if kind == "fifo" else src.mkdir()
    (tmp_path / "out").mkdir()
    with pytest.raises(extract.ExtractError, match=re.escape(str(src)) + ".*not a regular file"):
        extract.extract_one(src, tmp_path / "out", delete_compressed=True)
    assert not (tmp_path / "out" / "shard.jsonl").exists()
    assert src.exists()


@pytest.mark.timeout(20, method="signal")
@pytest.mark.parametrize("kind, word", [("fifo", "a FIFO"), ("folder", "a folder")])
def test_preprocess_names_an_input_that_is_not_a_regular_file(tmp_path, kind, word):
    from mlrepro.corpus import preprocess

    src = tmp_path / "input.jsonl"
    os.mkfifo(src) if kind == "fifo" else src.mkdir()
    opts = preprocess.Options(input=src, output_prefix=str(tmp_path / "out"), tokenizer_type="GPT2BPETokenizer")
    with pytest.raises(preprocess.InputError) as err:
        preprocess.preprocess(opts)
    msg = str(err.value)
    assert str(src) in msg and word in msg and "not a regular file" in msg and "no such file" not in msg
