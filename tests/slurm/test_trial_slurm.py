"""The trial mode as part of the DAG on the real local Slurm cluster (issue 35): gpt_126m with
`pretrain: trial: {candidates: 2}` and the CPU stand-in for pretrain_gpt.py runs its two candidates as
Slurm jobs (rule trial) before the seed, the measured fastest is chosen and the seed runs it, and
score.json's cost counts the trials' GPU-hours. The system has no container runtime: megatron_gpt's
run.sub runs the ranks on the host."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mlrepro.corpus import blend
from mlrepro.formats import indexed
from workspace import FIXTURES, make_workspace, planned_jobs, run_snakemake

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(900)]

SYSTEM = "local-slurm-gpt"
SLURM = ("--profile", "profiles/slurm", "--config", f"system={SYSTEM}", "--configfile", "run.yaml",
         "--slurm-init-seconds-before-status-checks", "1")


def _workspace(dest: Path) -> Path:
    """The workflow, a one-node system of 2 "GPUs" with the 2x H100 figures for the planner, the
    corpus stages' blend in place, and gpt_126m asking for a trial of 2 candidates."""
    ws = make_workspace(dest)
    hardware = yaml.safe_load((ws / "config/systems/device-h100x2.yaml").read_text())["hardware"]
    (ws / "config/systems" / f"{SYSTEM}.yaml").write_text(yaml.safe_dump({
        "name": SYSTEM, "scheduler": "slurm", "nodes": 1, "gpus_per_node": 2, "device": "cpu", "partition": "debug",
        "account": None, "container_runtime": "none", "implementation_configs": {}, "hardware": hardware,
        "slurm": {"status_command": "sacct", "poll_seconds": 2}}))
    bench = ws / "config/benchmarks/gpt_126m.yaml"
    bench.write_text(bench.read_text().replace("  layouts:\n", "  trial: {candidates: 2, iterations: 8}\n  layouts:\n"))
    corpus = ws / "resources" / "corpora" / "mini_corpus"
    prefix = corpus / "preprocessed" / "train_chunk_0_text_document"
    prefix.parent.mkdir(parents=True)
    w = indexed.IndexedWriter(f"{prefix}.bin")
    w.add_document(np.arange(40_000, dtype=np.uint16) % 97)  # its last tenth, the validation, holds a 2048-token sequence
    w.finalize(f"{prefix}.idx")
    blend.write_blend([str(prefix)], corpus / "data_prefix.json")
    (corpus / "tokenizer").mkdir()
    (corpus / "tokenizer" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(97)}))
    shutil.copytree(FIXTURES / "megatron_standin", ws / "standin")
    (ws / "run.yaml").write_text("benchmarks: [gpt_126m]\npretrain: {train_iters: 10, gbs: 4, mbs: 2, megatron: standin, "
                                 "walltime_minutes: 5}\n")
    return ws


@pytest.fixture(scope="module")
def trial(tmp_path_factory, slurm_cluster):
    ws = _workspace(tmp_path_factory.mktemp("trial") / "ws")
    dry = run_snakemake(ws, *SLURM, "-n", "--", "results/gpt_126m/score.json", timeout=300)
    run_snakemake(ws, *SLURM, "--", "results/gpt_126m/score.json", timeout=800)
    return ws, dry.stdout + dry.stderr


def test_the_dry_run_plans_the_trial_before_the_seed(trial):
    _, out = trial
    assert planned_jobs(out).get("trial") == 1 and planned_jobs(out).get("train_seed") == 1, out[-3000:]
    line = re.search(r"^(?:Job \d+: )?gpt_126m seed 1: (.+)$", out, flags=re.M)[1]
    assert line.startswith("layout chosen by the trial before the seeds (pretrain: trial: the planner's 2 best "
                           "layouts at GBS 4, 8 iterations each as jobs, the measured fastest)")


def test_two_trial_jobs_on_slurm_the_fastest_chosen_and_run_by_the_seed(trial):
    ws, _ = trial
    record = json.loads((ws / "results/gpt_126m/trials/trials.json").read_text())
    rows = record["candidates"]
    print(json.dumps(rows, indent=1))
    # the planner's two best of the seeds' micro-batch (pretrain: mbs 2), in its order
    assert len(rows) == 2 and rows[0]["rank"] < rows[1]["rank"] and len({r["tag"] for r in rows}) == 2
    assert all("MBS2" in r["layout"] for r in rows)
    assert all(r["predicted_s"] > 0 and r["measured_s"] > 0 and r["error_pct"] is not None for r in rows)
    fastest = min(rows, key=lambda r: r["measured_s"])
    assert record["chosen"]["tag"] == fastest["tag"] and record["system"] == SYSTEM and record["gbs"] == 4
    for r in rows:  # each candidate a Slurm job of its own, through the seeds' launcher
        job = json.loads((Path(r["folder"]) / "job.json").read_text())
        assert job["scheduler"] == "slurm" and job["job_id"]
        attempt = json.loads((Path(r["folder"]) / "attempt_1" / "attempt.json").read_text())
        assert attempt["state"] == "COMPLETED"
    # the seed runs the chosen layout
    seed = ws / "results/gpt_126m/seed_1"
    plan = json.loads((seed / "plan.json").read_text())
    assert plan["dgxsystem"] == f"gpt_126m-trial-{fastest['tag']}"
    chosen = fastest["layout"]
    argv = shlex.split((seed / "megatron_args.txt").read_text()) if (seed / "megatron_args.txt").is_file() else \
        shlex.split(Path(plan["env"]["MEGATRON_ARGS_FILE"]).read_text())
    mbs = re.search(r"MBS(\d+)", chosen)[1]
    assert argv[argv.index("--micro-batch-size") + 1] == mbs and argv[argv.index("--train-iters") + 1] == "10"
    assert json.loads((seed / "job.json").read_text())["scheduler"] == "slurm"
    # the trials' GPU-hours count in the benchmark's cost
    score = json.loads((ws / "results/gpt_126m/score.json").read_text())
    cost = score["cost"]
    assert set(cost["trials"]) == {r["tag"] for r in rows}
    trials_hours = sum(t["gpu_hours"] for t in cost["trials"].values())
    assert trials_hours == pytest.approx(record["gpu_hours"], rel=1e-3)
    assert cost["gpu_hours"] > trials_hours > 0
