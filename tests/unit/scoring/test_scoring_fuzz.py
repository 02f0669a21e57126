"""Fuzz: corrupted logs never make scoring raise, and every rejection has a reason."""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import logs_factory as lf
from mlrepro.scoring import score as scoring
from mlrepro.scoring.rules import rules_for
from mlrepro.scoring.mllog import parse_text

MAX_EXAMPLES = 400
RULES = rules_for("llama2_70b_lora")
BASE = lf.run_text(seed=7, minutes=21.5).encode()
RUN_KEYS = {"file", "seed", "benchmark", "minutes", "status", "converged", "target_reached",
            "samples_to_converge", "global_batch_size", "evals", "compliance", "counted", "reasons", "problems"}
seen = {"inputs": 0}

# One corruption: (kind, where in the log as a fraction, payload)
corruption = st.tuples(
    st.sampled_from(["truncate", "flip", "insert", "shuffle", "drop_key", "dup_line", "cut_line"]),
    st.floats(0, 1, allow_nan=False),
    st.binary(min_size=1, max_size=40),
)


def corrupt(data: bytes, ops) -> bytes:
    for kind, where, payload in ops:
        pos = int(where * len(data))
        lines = data.split(b"\n")
        at = min(int(where * len(lines)), len(lines) - 1)
        if kind == "truncate":
            data = data[:pos]
        elif kind == "flip" and data:
            i = min(pos, len(data) - 1)
            data = data[:i] + bytes([data[i] ^ payload[0] or 1]) + data[i + 1:]
        elif kind == "insert":
            data = data[:pos] + payload + data[pos:]
        elif kind == "shuffle":
            # seeded, not hash(): bytes hash differently in every process, and derandomize is to
            # give every run (CI's included) the same inputs
            random.Random(payload[0]).shuffle(lines)
            data = b"\n".join(lines)
        elif kind == "drop_key":
            key = [b"run_start", b"run_stop", b"eval_accuracy", b"global_batch_size", b"seed",
                   b"submission_benchmark"][payload[0] % 6]
            data = b"\n".join(ln for ln in lines if b'"' + key + b'"' not in ln)
        elif kind == "dup_line":
            data = b"\n".join(lines[:at + 1] + [lines[at]] + lines[at + 1:])
        elif kind == "cut_line":
            ln = lines[at]
            lines[at] = ln[: int(len(ln) * payload[0] / 255)]
            data = b"\n".join(lines)
    return data


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(corruption, min_size=1, max_size=4))
def test_corrupted_logs_never_raise(tmp_path, ops):
    seen["inputs"] += 1
    data = corrupt(BASE, ops)
    log = tmp_path / "result_0.txt"
    log.write_bytes(data)
    run = scoring.score_run(log, RULES)
    assert RUN_KEYS <= set(run)
    json.dumps(run)
    if run["counted"]:
        # what the official tools count and mlrepro's stricter reading does not is flagged
        assert run["minutes"] > 0 and run["compliance"]["pass"] and (run["converged"] or run["flags"])
    else:
        assert run["reasons"]
    # the same log among otherwise good runs: a score or reasons, never an exception
    good = [scoring.score_run(lf.write_run(tmp_path / f"g{i}.txt", seed=i, minutes=20 + i), RULES,
                              run_compliance=False) for i in range(2)]
    score = scoring.score_runs([], rules_for("llama2_70b_lora", required_runs=3), runs=[run, *good])
    assert score["valid"] or score["reasons"]
    json.dumps(score)
    parse_text(data.decode("latin-1"))  # the parser alone, on the same bytes


def test_fuzz_ran_all_examples():
    # runs after the fuzz test in file order; documents the number of inputs tried
    assert seen["inputs"] >= MAX_EXAMPLES, seen
    print(f"fuzz inputs scored: {seen['inputs']}")
