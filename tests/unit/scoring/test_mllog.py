"""mlrepro.scoring.mllog: reading MLLOG records out of raw and clean logs."""

from __future__ import annotations

import json

from mlperf_logging.compliance_checker.mlp_parser import parse_file

import logs_factory as lf
from mlrepro.scoring.mllog import extract_mllog, parse_log, parse_text


def test_clean_log_round_trips_through_the_official_parser(tmp_path):
    src = lf.write_run(tmp_path / "result_0.txt", minutes=12.5)
    log = parse_log(src)
    assert log.problems == []
    official, errors = parse_file(str(src), ruleset="5.0.0")
    assert errors == []
    assert [r.key for r in log.records] == [ll.key for ll in official]
    assert [r.time_ms for r in log.records] == [ll.timestamp for ll in official]
    assert log.to_text() == src.read_text()


def test_srun_prefixes_noise_and_ranks(tmp_path):
    lines = lf.run_lines(minutes=10)
    raw = tmp_path / "slurm-42.out"
    raw.write_text(lf.srun_text(lines, ranks=4))
    log = parse_log(raw)
    assert log.ranks == [0, 1, 2, 3] and log.rank_used == 0
    assert len(log.records) == len(lines)  # one copy of each record: rank 0's
    assert any("ranks" in p for p in log.problems)
    out = tmp_path / "mllog.txt"
    extract_mllog(raw, out)
    assert out.read_text() == "\n".join(lines) + "\n"
    # the extracted file is clean for the official parser too
    assert parse_file(str(out), ruleset="5.0.0")[1] == []


def test_other_prefixes_before_the_marker():
    rec = json.loads(lf.line("run_start", None, t=5)[len(":::MLLOG "):])
    text = (f"[1,0]<stdout>::::MLLOG {json.dumps(rec)}\n"
            f"2025-04-19 12:00:00 INFO worker :::MLLOG {json.dumps(dict(rec, key='run_stop', time_ms=65))}\n")
    log = parse_text(text)
    assert [r.key for r in log.records] == ["run_start", "run_stop"]
    assert log.records[0].rank == 0 and log.records[1].rank is None


def test_truncated_binary_and_malformed_lines_become_problems():
    good = lf.line("run_start", None, t=1000)
    text = "\n".join([
        good,
        good[: len(good) // 2],  # truncated JSON
        "\x00\xff\xfe garbage :::MLLOG \x00\x01",  # binary garbage after a marker
        ':::MLLOG {"key": "x", "time_ms": "soon", "value": 1, "metadata": {}}',
        ':::MLLOG {"key": "y", "time_ms": 1, "value": 1}',
        ':::MLLOG [1, 2]',
        lf.line("run_stop", None, t=61000, status="success") + " trailing",
    ])
    log = parse_text(text)
    assert [r.key for r in log.records] == ["run_start", "run_stop"]
    joined = "\n".join(log.problems)
    assert "line 2" in joined and "truncated" in joined
    assert "bad time_ms" in joined and "lacks metadata" in joined and "not a JSON object" in joined
    assert "text after" in joined


def test_two_records_on_one_line_are_both_read():
    a, b = lf.line("eval_start", None, t=1), lf.line("eval_stop", None, t=2)
    log = parse_text(a + b + "\n")
    assert [r.key for r in log.records] == ["eval_start", "eval_stop"]


def test_missing_and_empty_files(tmp_path):
    assert parse_log(tmp_path / "nope.txt").problems[0].startswith("cannot read")
    (tmp_path / "empty.log").write_bytes(b"")
    assert parse_log(tmp_path / "empty.log").problems == ["no MLLOG records found"]
    (tmp_path / "bin.log").write_bytes(bytes(range(256)) * 50)
    log = parse_log(tmp_path / "bin.log")
    assert log.records == [] and log.problems == ["no MLLOG records found"]


def test_problem_list_stays_short():
    text = "\n".join(":::MLLOG {broken" for _ in range(500))
    log = parse_text(text)
    assert len(log.problems) <= 22 and "more problems" in log.problems[-1]
