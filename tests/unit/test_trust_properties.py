"""Property tests (issue 26): the MLLOG and Megatron-LM parsers, the config loader, extract and the
indexed reader, fed edited and broken inputs by hypothesis. Each property says what may never
happen: a run counted with a time that is no time, a copy of a run counted twice, an exception other
than the module's own error, a hang, a partial output kept as complete, tokens read past their file.

Budget: EXAMPLES cases per property (env MLREPRO_PROPERTY_EXAMPLES scales them), about a minute for
the whole file on CI's 2 cores; the deadline is off because a shared machine stalls at random.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zstandard
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import logs_factory as lf
from mlrepro import config
from mlrepro.corpus import extract
from mlrepro.formats import indexed
from mlrepro.scoring import megatron_score
from mlrepro.scoring import score as scoring
from mlrepro.scoring.rules import rules_for

REPO = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("MLREPRO_PROPERTY_EXAMPLES", "1"))


def budget(n: int):
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])



# Run time limits: a counted run lies between 2000 and 2100 (mlrepro.scoring.integrity).
MAX_MINUTES = (4_102_444_800_000 - 946_684_800_000) / 60_000


# ---------------------------------------------------------------- MLLOG

MINI = rules_for("mini_lora", target="eval_accuracy<=2.5", required_runs=1)
BASE_LINES = lf.run_lines("mini_lora", seed=7, minutes=12.5)
# The named values first: a number's characters would match the "-" of "-Infinity" alone, and a second
# edit of the same line then wrote "0Infinity" (CI, once: the test's own JSON failed to parse).
TIME = re.compile(r'"time_ms": (?:NaN|-?Infinity|[-+0-9.eE]+)')

times = st.one_of(
    st.integers(-10**15, 10**16), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(lf.START_MS - 10**7, lf.START_MS + 10**7), st.sampled_from([0, -1, 1e300, -1e300, 2**63]))


def with_time(line: str, t) -> str:
    text = json.dumps(t) if not (isinstance(t, float) and not math.isfinite(t)) else repr(t).replace("inf", "Infinity").replace("nan", "NaN")
    return TIME.sub(f'"time_ms": {text}', line, count=1)


@budget(150)
@given(st.lists(st.tuples(st.integers(0, len(BASE_LINES) - 1), times), min_size=1, max_size=4))
@example(edits=[(0, float("-inf")), (0, 0)])  # a line edited twice, the first time to -Infinity
def test_mllog_no_counted_run_has_a_time_that_is_no_time(tmp_path_factory, edits):
    lines = list(BASE_LINES)
    for i, t in edits:
        lines[i] = with_time(lines[i], t)
    path = tmp_path_factory.mktemp("mllog") / "result_0.txt"
    path.write_text("\n".join(lines) + "\n")
    run = scoring.score_run(path, MINI, run_compliance=False)
    if run["counted"]:
        assert 0 < run["minutes"] < MAX_MINUTES
        records = [json.loads(line.split(":::MLLOG", 1)[1]) for line in lines]
        start = next(r for r in records if r["key"] == "run_start")["time_ms"]
        stop = next(r for r in records if r["key"] == "run_stop")["time_ms"]
        hits = [r for r in records if r["key"] == "eval_accuracy" and r["value"] <= 2.5]
        assert any(start <= r["time_ms"] <= stop for r in hits)
    else:
        assert run["reasons"]


copy_edit = st.sampled_from(["seed", "drop_seed", "shift_clock", "none"])


@budget(60)
@given(st.lists(copy_edit, min_size=2, max_size=4), st.integers(1, 10**9))
def test_mllog_copies_of_one_run_count_once(tmp_path_factory, edits, shift):
    folder = tmp_path_factory.mktemp("copies")
    paths = []
    for n, edit in enumerate(edits):
        lines = []
        for line in BASE_LINES:
            if '"key": "seed"' in line and edit in ("seed", "drop_seed"):
                if edit == "drop_seed":
                    continue
                line = re.sub(r'"value": \d+', f'"value": {1000 + n}', line)
            if edit == "shift_clock":
                t = json.loads(line.split(":::MLLOG", 1)[1])["time_ms"]
                line = with_time(line, t + shift)
            lines.append(line)
        paths.append(folder / f"result_{n}.txt")
        paths[-1].write_text("\n".join(lines) + "\n")
    rules = rules_for("mini_lora", target="eval_accuracy<=2.5", required_runs=len(edits))
    result = scoring.score_runs(paths, rules, run_compliance=False)
    assert sum(not r["duplicate"] for r in result["runs"]) == 1
    assert not result["valid"]


# ---------------------------------------------------------------- Megatron-LM

SDPA_LINES = (REPO / "tests" / "fixtures" / "megatron" / "megatron_sdpa.log").read_text().splitlines(keepends=True)
ITER_AT = [i for i, line in enumerate(SDPA_LINES) if re.search(r"\] iteration +\d+/", line)]
VALID_AT = [i for i, line in enumerate(SDPA_LINES) if "validation loss at iteration" in line]
START_AT = next(i for i, line in enumerate(SDPA_LINES) if "[before the start of training step]" in line)
TARGET = 4.5

megatron_edit = st.one_of(
    st.tuples(st.just("swap"), st.sampled_from(ITER_AT), st.sampled_from(ITER_AT)),
    st.tuples(st.just("copy_iteration"), st.sampled_from(ITER_AT), st.integers(0, len(SDPA_LINES))),
    st.tuples(st.just("move_start"), st.integers(0, len(SDPA_LINES)), st.just(0)),
    st.tuples(st.just("loss"), st.sampled_from(VALID_AT),
              st.one_of(st.floats(-10, 10, allow_nan=False), st.sampled_from([0.0, -0.0, 1e-300, -1.0]))),
    st.tuples(st.just("delete"), st.integers(0, len(SDPA_LINES) - 1), st.integers(1, 30)),
    st.tuples(st.just("append_run"), st.just(0), st.just(0)),
)


def apply(lines: list[str], edit) -> list[str]:
    kind, a, b = edit
    lines = list(lines)
    if kind == "swap":
        # an earlier edit may have deleted lines: the indices are of the log as it is now
        a, b = a % len(lines), b % len(lines)
        lines[a], lines[b] = lines[b], lines[a]
    elif kind == "copy_iteration":
        lines.insert(min(b, len(lines)), SDPA_LINES[a])
    elif kind == "move_start":
        start = SDPA_LINES[START_AT]
        lines = [line for line in lines if line != start]
        lines.insert(min(a, len(lines)), start)
    elif kind == "loss" and a < len(lines):
        lines[a] = re.sub(r"lm loss value: [-+0-9.E]+", f"lm loss value: {b:E}", lines[a])
    elif kind == "delete":
        del lines[a:a + b]
    elif kind == "append_run":
        lines += SDPA_LINES
    return lines


@budget(120)
@given(st.lists(megatron_edit, min_size=1, max_size=3))
def test_megatron_no_counted_run_is_out_of_order_or_impossible(tmp_path_factory, edits):
    lines = SDPA_LINES
    for edit in edits:
        lines = apply(lines, edit)
    path = tmp_path_factory.mktemp("megatron") / "run.log"
    path.write_text("".join(lines))
    rec = megatron_score.score_training_log(path, target_loss=TARGET)
    if rec["converged"] or rec["counted"]:
        assert rec["minutes"] is not None and 0 < rec["minutes"] < MAX_MINUTES
        iterations = [it for it, _ in rec["curve"]]
        assert iterations == sorted(set(iterations))
        hits = [loss for _, loss in rec["evals"] if loss <= TARGET]
        assert hits and all(loss > 0 for _, loss in rec["evals"])
        assert sum("[before the start of training step]" in line for line in lines) == 1
    else:
        assert rec["reasons"]


# ---------------------------------------------------------------- config

BENCH = REPO / "config" / "benchmarks" / "mini_lora.yaml"
BENCH_DATA = yaml.safe_load(BENCH.read_text())
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=20),
                    st.binary(max_size=8).map(lambda b: b.decode("latin-1")))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
keys = st.sampled_from(sorted(BENCH_DATA) + ["unknown_key", "seeds", "retries", "run_env", "env"])


def alias_document(width: int, depth: int, where: str) -> str:
    lines = [f"{where}:", f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def config_tree(tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(REPO / "config", root / "config")
    shutil.copytree(REPO / "workflow" / "schemas", root / "workflow" / "schemas")
    shutil.copytree(REPO / "implementations" / "mini_lora", root / "implementations" / "mini_lora")
    return root


def load_bounded(root: Path) -> None:
    """config.load, which may refuse (ConfigError) but not raise anything else, nor take long."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    start = time.monotonic()
    try:
        config.load(cfg, root)
    except config.ConfigError as exc:
        assert "mini_lora.yaml" in str(exc) or "config" in str(exc)
    assert time.monotonic() - start < 5


@budget(150)
@given(st.lists(st.tuples(keys, values), min_size=1, max_size=3))
def test_config_any_value_at_any_key_is_loaded_or_refused(config_tree, edits):
    data = dict(BENCH_DATA)
    for k, v in edits:
        data[k] = v
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        assume(False)
    (config_tree / "config" / "benchmarks" / "mini_lora.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_bounded(config_tree)
    finally:
        (config_tree / "config" / "benchmarks" / "mini_lora.yaml").write_text(BENCH.read_text())


@budget(40)
@given(st.integers(1, 12), st.integers(1, 12), st.sampled_from(["unknown_key", "env", "run_env", "description"]),
       st.binary(max_size=6))
def test_config_aliases_and_bytes_are_refused_fast(config_tree, width, depth, where, junk):
    path = config_tree / "config" / "benchmarks" / "mini_lora.yaml"
    path.write_bytes(BENCH.read_bytes() + alias_document(width, depth, where).encode() + b"# " + junk + b"\n")
    try:
        load_bounded(config_tree)
    finally:
        path.write_text(BENCH.read_text())


# ---------------------------------------------------------------- extract

frames = st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=5)


@budget(100)
@given(frames, st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
       st.one_of(st.none(), st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255))))
def test_extract_gives_the_whole_shard_or_an_error_and_keeps_the_source(tmp_path_factory, chunks, cut, flip):
    folder = tmp_path_factory.mktemp("zst")
    cctx = zstandard.ZstdCompressor(level=1, write_checksum=True)
    parts = [cctx.compress(c) for c in chunks]
    packed = b"".join(parts)
    expected = b"".join(chunks)
    if cut is not None:
        packed = packed[:int(cut * len(packed))]
        # A stream cut exactly between two frames is a valid, shorter stream: no reader can tell
        # (the download's size or checksum must); cut anywhere else, it is an error.
        ends = list(np.cumsum([len(p) for p in parts]))
        expected = b"".join(chunks[:ends.index(len(packed)) + 1]) if len(packed) in ends else None
    if flip is not None and packed:
        at = int(flip[0] * len(packed))
        packed = packed[:at] + bytes([packed[at] ^ flip[1]]) + packed[at + 1:]
    src = folder / "s.jsonl.zst"
    src.write_bytes(packed)
    (folder / "out").mkdir()
    try:
        out = extract.extract_one(src, folder / "out", delete_compressed=True)
    except extract.ExtractError as exc:
        assert str(src) in str(exc)
        assert src.exists() and not (folder / "out" / "s.jsonl").exists()
        assert not list((folder / "out").iterdir())
    else:
        assert expected is not None, "a shard cut inside a frame was extracted"
        assert out.read_bytes() == expected
        assert not src.exists()


# ---------------------------------------------------------------- indexed reader

documents = st.lists(st.lists(st.integers(0, 65535), max_size=20), min_size=0, max_size=12)
damage = st.one_of(
    st.tuples(st.just("truncate"), st.sampled_from(["idx", "bin"]), st.floats(0, 1, exclude_max=True), st.just(0)),
    st.tuples(st.just("byte"), st.sampled_from(["idx", "bin"]), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("append"), st.sampled_from(["idx", "bin"]), st.just(0.0), st.integers(0, 255)),
    st.tuples(st.just("word"), st.just("idx"), st.floats(0, 1, exclude_max=True), st.integers(-2**63, 2**63 - 1)),
)


@budget(200)
@given(documents, st.lists(damage, max_size=3))
def test_indexed_reader_refuses_or_reads_within_bounds(tmp_path_factory, docs, damages):
    prefix = tmp_path_factory.mktemp("idx") / "ds"
    w = indexed.IndexedWriter(f"{prefix}.bin", np.uint16)
    for d in docs:
        w.add_document(d)
    w.finalize(f"{prefix}.idx")
    for kind, which, where, value in damages:
        path = Path(f"{prefix}.{which}")
        raw = bytearray(path.read_bytes())
        at = int(where * len(raw))
        if kind == "truncate":
            raw = raw[:at]
        elif kind == "byte" and raw:
            raw[min(at, len(raw) - 1)] = value
        elif kind == "append":
            raw.append(value)
        elif kind == "word" and len(raw) >= 8:
            struct.pack_into("<q", raw, min(at, len(raw) - 8), value)
        path.write_bytes(bytes(raw))
    try:
        r = indexed.IndexedReader(prefix)
        seqs = [r[i] for i in range(len(r))]
        read_docs = [r.document(d) for d in range(r.num_documents)]
    except indexed.IndexedFormatError as exc:
        assert str(prefix) in str(exc)
        return
    assert [len(s) for s in seqs] == [int(n) for n in r.sequence_lengths]
    assert sum(len(d) for d in read_docs) == sum(len(s) for s in seqs)
    if not damages:
        assert [d.tolist() for d in read_docs] == docs
