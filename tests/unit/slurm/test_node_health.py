"""Bad nodes of a reproduction (issue 24): recorded once, excluded from later seeds, cleared by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlrepro.slurm import client, node_health


def test_record_once_exclude_and_clear(tmp_path):
    path = node_health.bad_nodes_file(tmp_path, "local-slurm")
    assert path == tmp_path / "results" / "nodes" / "local-slurm" / "bad_nodes.json"
    assert node_health.excluded(path) == []
    assert node_health.record(path, "node2", "quick preflight failed", benchmark="mini_lora", seed=3, attempt=1,
                              job_id="41", now="2026-11-26T22:00:00+00:00")
    assert not node_health.record(path, "node2", "again", seed=4)  # the first record stays
    rec = node_health.read(path)["node2"]
    assert rec["seed"] == 3 and rec["why"] == "quick preflight failed" and rec["since"].startswith("2026-11-26")
    assert node_health.exclude_list(("node9",), path) == ("node9", "node2")
    assert node_health.exclude_list(("node2",), path) == ("node2",)
    assert node_health.clear(path, "node7") == []
    assert node_health.clear(path, "node2") == ["node2"] and node_health.excluded(path) == []


def test_clear_all_and_a_damaged_record_is_named(tmp_path):
    path = tmp_path / "bad_nodes.json"
    for n in ("a", "b"):
        node_health.record(path, n, "x")
    assert node_health.clear(path) == ["a", "b"]
    path.write_text("{not json")
    with pytest.raises(ValueError, match="bad_nodes.json: cannot read the bad-node record"):
        node_health.excluded(path)
    path.write_text(json.dumps({"other": 1}))
    with pytest.raises(ValueError, match="no 'nodes' mapping"):
        node_health.excluded(path)
    with pytest.raises(ValueError, match="not a node name"):
        node_health.record(tmp_path / "n.json", "", "x")


def test_parallel_seeds_failing_on_one_node_record_it_once(tmp_path):
    # Separate interpreters, as parallel seeds are: a fork of this threaded test process could inherit a held lock.
    path = tmp_path / "bad_nodes.json"
    code = ("import sys; from mlrepro.slurm import node_health; "
            "sys.exit(0 if node_health.record(sys.argv[1], sys.argv[2], 'writer', seed=int(sys.argv[3])) else 3)")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(path), "node1" if i % 2 else "node2", str(i)])
               for i in range(16)]
    codes = [w.wait(timeout=120) for w in writers]
    assert sorted(codes) == [0, 0] + [3] * 14 and node_health.excluded(path) == ["node1", "node2"]


@pytest.mark.parametrize("state,log,expected", [
    ("NODE_FAIL", "", "Slurm job ended NODE_FAIL"),
    ("PREFLIGHT_FAILED", "", "quick preflight failed"),
    ("FAILED", "step 3\nNVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus\n", "GPU error in the run's log: NVRM"),
    ("FAILED", "Traceback: ValueError: bad LR", None),
    ("OUT_OF_MEMORY", "", None),
    ("TIMEOUT", "", None),
])
def test_node_side_failures_are_told_from_job_failures(state, log, expected):
    why = node_health.node_side(state, log)
    assert (why is None) if expected is None else why.startswith(expected)


def test_a_node_failure_is_laid_on_the_nodes_slurm_took_out_of_service():
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    why = "Slurm job ended NODE_FAIL"
    blamed = node_health.blamed(nodes, why, {"gpu03": "down* (Not responding)", "gpu09": "drained"})
    assert blamed == {"gpu03": "Slurm job ended NODE_FAIL; Slurm has it down* (Not responding)"}
    # Slurm names none of the job's nodes (back already), or cannot say: every node of the job
    assert node_health.blamed(nodes, why, {}) == node_health.blamed(nodes, why, None) == dict.fromkeys(nodes, why)


def test_sinfo_states_that_take_a_node_out_of_service():
    text = "\n".join([
        "gpu01|idle|none", "gpu02|down*|Not responding", "gpu03|drained|Kill task failed",
        "gpu04|mixed|none", "gpu05|idle*|none", "gpu06|allocated+|none", "gpu07|draining@|NHC: Xid 79",
        "gpu08|fail|none", "gpu02|down*|Not responding",  # a node in two partitions is listed twice
        "gpu09|completing|none", "gpu10|reserved|none", "", "garbage"])
    assert client.parse_out_of_service(text) == {
        "gpu02": "down* (Not responding)", "gpu03": "drained (Kill task failed)", "gpu05": "idle*",
        "gpu07": "draining@ (NHC: Xid 79)", "gpu08": "fail"}
