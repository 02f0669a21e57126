"""mini_gpt's plan: the corpus stages come before its seeds, a chained seed's jobs are segment-sized,
and a bad `segments:` block is refused naming the file and key (snakemake -n, no job runs)."""

from __future__ import annotations

from mlrepro import config
from mlrepro.kinds import mlperf as launch
from workspace import make_workspace, planned_jobs, run_snakemake


def test_the_score_plans_the_corpus_stages_before_the_seeds(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = run_snakemake(ws, "-n", "--", "results/mini_gpt/score.json", timeout=300)
    jobs = planned_jobs(proc.stdout + proc.stderr)
    # the corpus is preprocessed by one job (one array on Slurm, see mlrepro.launch.array)
    assert jobs["train_seed"] == 3 and jobs["corpus_preprocess"] == 1 and jobs["corpus_blend"] == 1
    assert "dataset" not in jobs and "base_checkpoint" not in jobs  # pretrained from scratch on the corpus
    # Every seed waits for the corpus's blend (and the container), which the corpus stages build.
    lines = (proc.stdout + proc.stderr).splitlines()
    for seed in (1, 2, 3):
        reason = next(line for line in lines if f"Missing output files: results/mini_gpt/seed_{seed}/mllog.txt" in line)
        updated = reason.split("Input files updated by another job:")[1]
        assert "resources/corpora/mini_corpus/data_prefix.json" in updated, reason


def test_a_job_limit_makes_segment_sized_jobs_that_checkpoint(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    settings = config.load({"benchmarks": ["mini_gpt"], "system": "local-slurm"}, ws)
    plan = launch.plan_seed(settings, "mini_gpt", 1)
    assert plan.env["CHECKPOINT_DIR"] == str(ws / "results/mini_gpt/seed_1/checkpoints")
    assert plan.env["DATADIR"] == str(ws / "resources/corpora/mini_corpus") and "JOB_SECONDS" not in plan.env
    system = ws / "config/systems/local-slurm.yaml"
    system.write_text(system.read_text() + "max_job_minutes: 2\n")
    plan = launch.plan_seed(config.load({"benchmarks": ["mini_gpt"], "system": "local-slurm"}, ws), "mini_gpt", 1)
    assert plan.env["JOB_SECONDS"] == "120" and plan.env["MARGIN_SECONDS"] == "2"
    assert plan.walltime_minutes == 2


def test_a_bad_segments_block_is_refused_before_any_job(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    path = ws / "config/benchmarks/mini_gpt.yaml"
    path.write_text(path.read_text().replace("margin_seconds: 2", "margin_seconds: -5"))
    proc = run_snakemake(ws, "-n", "--", "results/mini_gpt/score.json", check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config/benchmarks/mini_gpt.yaml" in out and "segments.margin_seconds" in out
