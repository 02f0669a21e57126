"""A node that fails its quick preflight is kept out of every later seed (issue 24), on the real local cluster.

The fault: MLREPRO_PREFLIGHT_FAIL_NODES=node2 in the workflow's environment reaches every job
(sbatch --export=ALL), and the quick preflight that srun runs before each node's first rank
(SLURM_TASK_PROLOG, set by the Slurm backend) fails on the node it names. Nothing of the cluster
is touched: no drain, no config. Three one-node seeds, two at a time, so one of the first two lands
on node2; short runs (MAX_STEPS) keep it to a minute or two of cluster time.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlrepro.scoring import cost
from mlrepro.slurm import client as slurm
from mlrepro.slurm import node_health
from workspace import make_workspace, run_snakemake

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SYSTEM = """name: local-slurm-pernode
scheduler: slurm
nodes: 2
gpus_per_node: 4
partition: debug
implementation_configs:
  mini_lora: config_CPU_1x2x8xtp1pp1cp1.sh   # one node a seed: two seeds side by side
slurm: {status_command: sacct, poll_seconds: 2}
"""


@pytest.fixture(scope="module")
def excluded_run(slurm_cluster, mini_lora_data, tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("nodes") / "ws", data_from=mini_lora_data)
    (ws / "config" / "systems" / "local-slurm-pernode.yaml").write_text(SYSTEM)
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    text = bench.read_text().replace("required_runs: 10", "required_runs: 3")
    bench.write_text(text + "env:\n  MAX_STEPS: '30'\n")
    proc = run_snakemake(ws, "--profile", "profiles/slurm", "--config", "system=local-slurm-pernode",
                         "--slurm-init-seconds-before-status-checks", "1", "--cores", "2",
                         "results/mini_lora/score.json", timeout=1500,
                         env={"MLREPRO_PREFLIGHT_FAIL_NODES": "node2"}, check=False)
    return ws, proc


def _jobs(ws: Path) -> list[slurm.JobInfo]:
    jobs = []
    for seed in (1, 2, 3):
        folder = ws / "results" / "mini_lora" / f"seed_{seed}"
        for attempt in sorted(folder.glob("attempt_*/attempt.json")):
            rec = json.loads(attempt.read_text())
            jobs.append((seed, {**rec, "attempt": int(attempt.parent.name.split("_")[1])}))
    return jobs


def test_the_failing_node_is_recorded_once_and_no_later_seed_runs_on_it(excluded_run):
    ws, proc = excluded_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = node_health.read(node_health.bad_nodes_file(ws, "local-slurm-pernode"))
    assert list(record) == ["node2"], record
    bad = record["node2"]
    assert "quick preflight" in bad["why"] or "MLREPRO_PREFLIGHT_FAIL_NODES" in bad["why"]
    attempts = _jobs(ws)
    on_node2 = [a for _, a in attempts if "node2" in a["node_names"]]
    assert on_node2 and all(a["state"] != "COMPLETED" for a in on_node2), attempts
    # sacct: every job submitted after the node was recorded ran elsewhere (a seed queued before
    # may still meet node2; its preflight fails it there too, and its retry excludes the node). A
    # retry is submitted after the failure that recorded the node, also within the same second,
    # which sacct's submit time (whole seconds) cannot order.
    since = dt.datetime.fromisoformat(bad["since"])
    later = []
    for _, a in attempts:
        info = slurm.accounting(a["job_id"])
        if a["attempt"] > 1 or dt.datetime.fromisoformat(info.submit).astimezone() > since:
            later.append(a)
            assert "node2" not in info.nodes, (a, info)
        assert info.elapsed_seconds == a["elapsed_s"], (a, info)  # each attempt's elapsed is sacct's own
    assert later, attempts
    # The spent figure adds up the attempts' own elapsed times: nodes x ranks x sacct's elapsed.
    spent = cost.benchmark_cost(ws / "results" / "mini_lora", gpus_per_node=2)["gpu_hours"]
    assert spent == pytest.approx(sum(a["nodes"] * 2 * a["elapsed_s"] for _, a in attempts) / 3600)


def test_status_names_the_excluded_node_and_the_clear_command_clears_it(excluded_run):
    ws, _ = excluded_run
    out = subprocess.run([sys.executable, "-m", "mlrepro", "status", str(ws / "results" / "mini_lora")],
                         capture_output=True, text=True, cwd=ws, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "excluded nodes (local-slurm-pernode): node2" in out.stdout and "preflight failed on node2" in out.stdout
    assert "spent" in out.stdout
    clear = subprocess.run([sys.executable, "-m", "mlrepro", "nodes", "clear", "node2", "--system",
                            "local-slurm-pernode"], capture_output=True, text=True, cwd=ws, timeout=60)
    assert clear.returncode == 0 and "node2" in clear.stdout, clear.stderr
    assert node_health.excluded(node_health.bad_nodes_file(ws, "local-slurm-pernode")) == []
