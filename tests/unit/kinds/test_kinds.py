"""The two kinds behind one interface (mlrepro.kinds): what the DAG reserves for a seed, and the plan
the seed writes once into its folder (plan.json) for its score and `mlrepro status`."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mlrepro import config as mlrepro_config
from mlrepro import kinds, paths, status
from mlrepro.kinds import megatron, mlperf
from mlrepro.launch import job
from workspace import make_workspace


def _two_gpu_machine(ws: Path) -> str:
    """device-h100 with a second GPU on the same NVLink: one local machine, two ranks."""
    system = yaml.safe_load((ws / "config" / "systems" / "device-h100.yaml").read_text())
    system.update(name="device-2xh100", gpus_per_node=2)
    system["hardware"]["nvlink_domain_gpus"] = 2
    (ws / "config" / "systems" / "device-2xh100.yaml").write_text(yaml.safe_dump(system))
    # The benchmark's two-rank layout first (the first layout that fits is the one planned).
    bench_file = ws / "config" / "benchmarks" / "gpt_126m.yaml"
    bench = yaml.safe_load(bench_file.read_text())
    layouts = bench["pretrain"]["layouts"]
    bench["pretrain"]["layouts"] = [x for x in layouts if x.get("dp") == 2] + [x for x in layouts if x.get("dp") != 2]
    bench_file.write_text(yaml.safe_dump(bench, sort_keys=False))
    return "device-2xh100"


def test_a_local_multi_rank_megatron_seed_reserves_one_core_per_rank(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    settings = mlrepro_config.load({"benchmarks": ["gpt_126m"], "system": _two_gpu_machine(ws)}, ws)
    bench = settings.benchmark("gpt_126m")
    assert kinds.of(bench) is megatron
    plan = megatron.dag_plan(settings, "gpt_126m", 1)
    assert plan.scheduler == "local" and plan.ranks == 2
    # As an MLPerf seed does: a local seed occupies one core per rank (and its memory).
    assert plan.local_threads == 2 and plan.local_mem_mb == 2000
    assert plan.describe().startswith("gpt-125m-2xdp on device-2xh100: 1 node(s) x 2 GPUs")


def test_the_plan_is_kept_in_the_seed_folder_and_read_back(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    settings = mlrepro_config.load({"benchmarks": ["mini_lora"], "system": "local"}, ws)
    assert kinds.of(settings.benchmark("mini_lora")) is mlperf
    plan = mlperf.plan_seed(settings, "mini_lora", 3)
    job.write_plan(plan)
    assert job.read_plan(plan.seed_dir) == plan
    record = json.loads(paths.plan_file(plan.seed_dir).read_text())
    assert record["ranks"] == plan.ranks and record["seed"] == 3
    seen = status.seed_status(3, plan.seed_dir)
    assert (seen.state, seen.ranks, seen.walltime_minutes) == (status.NOT_STARTED, plan.ranks, plan.walltime_minutes)
    assert job.read_plan(plan.seed_dir.parent / "seed_4") is None
