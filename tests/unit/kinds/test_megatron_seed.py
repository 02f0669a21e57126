"""A GPT pretraining seed as a launch plan (mlrepro.kinds.megatron): the planner's launch line
on the corpus stages' blend, torchrun on one machine and run.sub on Slurm; the Megatron log kept as
the seed's log; and the whole chain (corpus stages → train_seed → score_seed → score) through
snakemake with a CPU stand-in for pretrain_gpt.py (tests/fixtures/megatron_standin)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlrepro import config as mlrepro_config
from mlrepro.corpus import blend, minicorpus
from mlrepro.formats import indexed
from mlrepro.launch import job as launch
from mlrepro.kinds import megatron as megatron_seed
from mlrepro.pretrain import megatron_plan
from mlrepro.scoring import tfevents
from workspace import make_workspace, run_snakemake
import workspace

FIXTURES = workspace.FIXTURES


def _workspace(dest: Path, vocab: int = 554) -> Path:
    ws = make_workspace(dest)
    corpus = ws / "resources" / "corpora" / "mini_corpus"
    prefix = corpus / "preprocessed" / "train_chunk_0_text_document"
    prefix.parent.mkdir(parents=True)
    w = indexed.IndexedWriter(f"{prefix}.bin")
    w.add_document(np.arange(64, dtype=np.uint16))
    w.finalize(f"{prefix}.idx")
    blend.write_blend([str(prefix)], corpus / "data_prefix.json")
    (corpus / "tokenizer").mkdir()
    (corpus / "tokenizer" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(vocab)}))
    return ws


def _settings(ws: Path, system: str, **pretrain) -> mlrepro_config.Settings:
    return mlrepro_config.load({"benchmarks": ["gpt_126m"], "system": system, "pretrain": pretrain}, ws)


def test_local_seed_runs_the_planners_torchrun_line_on_the_blend(tmp_path):
    ws = _workspace(tmp_path / "ws")
    settings = _settings(ws, "device-h100", train_iters=300, gbs=16, mbs=8, attention="sdpa",
                         megatron=str(FIXTURES / "megatron_standin"))
    plan = megatron_seed.prepare(settings, "gpt_126m", 1)
    assert plan.scheduler == "local" and plan.ranks == 1 and plan.dgxsystem == "gpt-125m"
    assert plan.implementation_dir == ws / "implementations" / "megatron_gpt"
    argv = shlex.split(Path(plan.env["MEGATRON_LAUNCH_FILE"]).read_text())
    assert Path(plan.env["MEGATRON_LAUNCH_FILE"]) == plan.seed_dir / "launch.sh"
    assert argv[:4] == ["torchrun", "--standalone", "--nproc-per-node=1", "pretrain_gpt.py"]
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert (flag("--train-iters"), flag("--global-batch-size"), flag("--micro-batch-size")) == ("300", "16", "8")
    assert argv[argv.index("--data-path") + 2] == str(ws / "resources/corpora/mini_corpus/preprocessed/train_chunk_0_text_document")
    assert (flag("--tokenizer-type"), flag("--vocab-size"), flag("--seed")) == ("NullTokenizer", "554", "1")
    # Megatron-LM's own event files into the seed's folder, read by the report and `mlrepro status`
    assert flag("--tensorboard-dir") == str(plan.seed_dir / "tensorboard") and "--log-timers-to-tensorboard" in argv
    assert argv[-3:] == ["--spec", "sdpa_spec", "sdpa_layer_spec"]
    # Megatron-LM is put in place once, from the folder (or tarball) the settings name.
    assert (Path(plan.env["MEGATRON_DIR"]) / "pretrain_gpt.py").is_file()


def test_slurm_seed_is_run_sub_with_per_rank_arguments(tmp_path):
    ws = _workspace(tmp_path / "ws")
    settings = _settings(ws, "dgxh100-64x8", megatron=str(FIXTURES / "megatron_standin"), image="/img/megatron.sqsh")
    plan = megatron_seed.prepare(settings, "gpt_126m", 1)
    assert plan.scheduler == "slurm" and plan.sbatch.render()[0] == "sbatch"
    assert plan.sbatch.render()[-1] == str(ws / "implementations" / "megatron_gpt" / "run.sub")
    assert plan.env["CONT"] == "/img/megatron.sqsh" and plan.env["DATADIR"] == str(ws / "resources/corpora/mini_corpus")
    argv = shlex.split(Path(plan.env["MEGATRON_ARGS_FILE"]).read_text())
    assert argv[0] == "--num-layers"  # srun starts the ranks: no torchrun in front
    assert argv[argv.index("--data-path") + 2] == "/data/preprocessed/train_chunk_0_text_document"
    assert argv[argv.index("--train-iters") + 1] == "4769"  # 2.5B tokens / (256 x 2048)


@pytest.mark.parametrize("system", ["device-h100", "dgxh100-64x8"])
def test_the_dry_run_shows_the_line_each_seed_runs(tmp_path, system):
    """Seed N's dry-run message (megatron_plan.dry_run) shows the line megatron_seed.plan_seed runs
    for seed N: its seed number, warm-up, tokenizer, attention and Megatron-LM's local implementation.
    On Slurm the message shows run.sub's srun in front of the per-rank arguments the seed writes."""
    ws = _workspace(tmp_path / "ws")
    path = ws / "config" / "benchmarks" / "gpt_126m.yaml"
    path.write_text(path.read_text() + "seeds: [3, 8]\n")
    settings = _settings(ws, system, train_iters=300, gbs=16, mbs=8, attention="sdpa")
    bench = settings.benchmark("gpt_126m")
    runs = {}
    for seed in bench.seeds:
        head, *_, shown = megatron_plan.dry_run(ws, bench, system, settings.pretrain_overrides,
                                                  seed=seed).describe.split(" | ")
        runs[seed] = megatron_seed.plan_seed(settings, "gpt_126m", seed).env["MEGATRON_LINE"]
        assert head.endswith(f"launch line of seed {seed}")
        if system == "dgxh100-64x8":
            argv = shlex.split(shown)
            assert argv[0] == "srun" and argv[argv.index("python") + 2:] == shlex.split(runs[seed])
        else:
            assert shown == runs[seed]
    # The seeds' lines differ by the seed number and the folder each writes its event files into alone.
    a, b = (shlex.split(runs[seed]) for seed in bench.seeds)
    folders = tuple(str(ws / f"results/gpt_126m/seed_{seed}/tensorboard") for seed in bench.seeds)
    assert [(x, y) for x, y in zip(a, b, strict=True) if x != y] == [("3", "8"), folders]
    assert a[a.index("--seed") + 1] == "3"


def test_a_seed_refuses_to_start_before_the_corpus_stages_have_run(tmp_path):
    """The dry run shows UNPREPARED for the corpus it has not seen yet; the seed itself refuses."""
    ws = make_workspace(tmp_path / "ws")
    settings = _settings(ws, "device-h100")
    shown = megatron_plan.dry_run(ws, settings.benchmark("gpt_126m"), "device-h100").describe
    assert "preprocessed/UNPREPARED" in shown and "--vocab-size UNPREPARED" in shown
    with pytest.raises(mlrepro_config.ConfigError, match="data_prefix.json is missing: run the corpus stages"):
        megatron_seed.plan_seed(settings, "gpt_126m", 1)


@pytest.mark.parametrize("benchmark, system", [("gpt_8b_nemo", "dgxh100-64x8")])
def test_a_seed_of_another_launcher_refuses_what_its_plan_only_shows(tmp_path, benchmark, system):
    """The NeMo guide's command is rendered for review; its seeds would otherwise train Megatron-LM under a
    plan that showed something else (Megatron-DeepSpeed's seeds are kinds.megatron_deepspeed's)."""
    ws = _workspace(tmp_path / "ws")
    settings = mlrepro_config.load({"benchmarks": [benchmark], "system": system}, ws)
    head = megatron_plan.dry_run(ws, settings.benchmark(benchmark), system).describe.split(" | ")[0]
    assert "own command, for review: mlrepro trains seeds with Megatron-LM (launcher: megatron) and " in head
    with pytest.raises(mlrepro_config.ConfigError, match=rf"{benchmark}: layout .* own command .*launcher: megatron"):
        megatron_seed.plan_seed(settings, benchmark, 1)


def test_bad_batch_override_is_a_config_error(tmp_path):
    ws = _workspace(tmp_path / "ws")
    with pytest.raises(mlrepro_config.ConfigError, match="gbs 12 is not a multiple of mbs 8"):
        megatron_seed.plan_seed(_settings(ws, "device-h100", gbs=12, mbs=8), "gpt_126m", 1)


def _plan(tmp_path: Path) -> launch.SeedPlan:
    ws = _workspace(tmp_path / "ws")
    return megatron_seed.plan_seed(_settings(ws, "device-h100", train_iters=300), "gpt_126m", 1)


def test_finished_megatron_log_becomes_the_seeds_log(tmp_path):
    plan = _plan(tmp_path)
    plan.seed_dir.mkdir(parents=True)
    (plan.seed_dir / "failure.json").write_text("{}")  # an earlier attempt's
    out = plan.seed_dir / "mllog.txt"
    megatron_seed.finish_seed(None, plan, FIXTURES / "megatron" / "megatron_sdpa.log", out)
    assert out.read_text() == (FIXTURES / "megatron" / "megatron_sdpa.log").read_text()
    assert not (plan.seed_dir / "failure.json").exists()


def test_truncated_megatron_log_fails_the_seed_naming_the_iteration(tmp_path):
    plan = _plan(tmp_path)
    plan.seed_dir.mkdir(parents=True)
    lines = (FIXTURES / "megatron" / "megatron_sdpa.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "iteration      150/" in line)
    log = tmp_path / "run.log"
    log.write_text("".join(lines[:cut + 1]))
    with pytest.raises(launch.SeedFailed, match="ends at iteration 150 of 300"):
        megatron_seed.finish_seed(None, plan, log, plan.seed_dir / "mllog.txt")
    assert json.loads((plan.seed_dir / "failure.json").read_text())["state"] == "INCOMPLETE_LOG"
    assert not (plan.seed_dir / "mllog.txt").exists()


def test_a_run_ended_by_its_loop_is_a_result_though_its_last_iteration_is_unlogged(tmp_path):
    """--train-iters 305 at --log-interval 10 (the planner's counts seldom divide by 10): the log's last line is
    300/305, then "[after training is done]" and the final validation at 305, which counts."""
    from mlrepro.scoring import integrity, megatron_log

    plan = _plan(tmp_path)
    plan.seed_dir.mkdir(parents=True)
    text = (FIXTURES / "megatron" / "megatron_sdpa.log").read_text().replace("/     300 |", "/     305 |")
    text = text.replace("validation loss at iteration 300 on", "validation loss at iteration 305 on")
    log = tmp_path / "run.log"
    log.write_text(text)
    megatron_seed.finish_seed(None, plan, log, plan.seed_dir / "mllog.txt")
    parsed = megatron_log.parse_log(plan.seed_dir / "mllog.txt")
    assert parsed.training_done and integrity.validation_problems(parsed) == []
    log.write_text(text[: text.index("[after training is done]")])
    with pytest.raises(launch.SeedFailed, match="ends at iteration 300 of 305"):
        megatron_seed.finish_seed(None, plan, log, tmp_path / "other.txt")


@pytest.mark.slow
def test_gpt_seed_through_the_workflow_from_the_corpus_stages(tmp_path):
    """corpus stages → train_seed (torchrun of the stand-in) → score_seed → score, on a CPU system
    with the device's hardware figures; about 20 s."""
    ws = make_workspace(tmp_path / "ws")
    system = (ws / "config/systems/device-h100.yaml").read_text()
    (ws / "config/systems/cpu-h100.yaml").write_text(
        system.replace("name: device-h100", "name: cpu-h100").replace("device: cuda", "device: cpu"))
    server = minicorpus.serve(minicorpus.make_mini_corpus(tmp_path / "srv"))
    corpus_yaml = ws / "config/corpora/mini_corpus.yaml"
    corpus_yaml.write_text(corpus_yaml.read_text().replace("127.0.0.1:18765", f"127.0.0.1:{server.server_address[1]}"))
    shutil.copytree(FIXTURES / "megatron_standin", ws / "standin")
    (ws / "run.yaml").write_text("benchmarks: [gpt_126m]\ncorpora: [mini_corpus]\npretrain: {train_iters: 30, "
                                 "gbs: 4, mbs: 2, megatron: standin, walltime_minutes: 5}\n")
    try:
        run_snakemake(ws, "-c2", "--scheduler", "greedy", "results/gpt_126m/score.json", "--configfile", "run.yaml",
                      "--config", "system=cpu-h100", timeout=300)
    finally:
        server.shutdown()
    seed = ws / "results/gpt_126m/seed_1"
    launched = shlex.split((seed / "launch.sh").read_text())
    assert launched[:3] == ["torchrun", "--standalone", "--nproc-per-node=1"]
    assert json.loads((seed / "job.json").read_text())["scheduler"] == "local"
    assert (seed / "attempt_1" / "run.log").read_text() == (seed / "mllog.txt").read_text()
    run = json.loads((seed / "run.json").read_text())
    assert run["source"] == "megatron" and run["status"] == "success" and run["seed"] == 1
    assert run["curve"][-1][0] == 30 and run["throughput"]["peak_tflops"] == 989
    assert run["throughput"]["tokens_per_s"] > 0
    # The trainer's event files (the stand-in writes them as Megatron-LM does): every iteration's loss, of which the
    # log prints every tenth, and the validations the run record has from the log.
    trained = tfevents.trainer_curves(seed / "tensorboard")
    assert [s for s, _ in trained.training] == list(range(1, 31)) and trained.skipped == []
    by_step = dict(trained.training)
    assert all(by_step[i] == pytest.approx(loss, rel=1e-5) for i, loss in run["curve"])
    assert [v for _, v in trained.validation_by_samples] == pytest.approx([v for _, v in run["evals"]], rel=1e-5)
    # ... and the scored curve, under results/tensorboard/ beside every other seed's, reads back as run.json has it
    scored = tfevents.read_scalars(ws / "results/tensorboard/gpt_126m/seed_1")
    assert scored.series == tfevents.scored_series(run, "val_loss") and set(scored.series) == {"val_loss vs samples",
                                                                                                "lm loss"}
    score = json.loads((ws / "results/gpt_126m/score.json").read_text())
    assert score["runs_failed"] + score["runs_counted"] == 1
    # learn from every run: the seed's measured step kept beside the plan's prediction, the fit redone
    kept = json.loads((ws / "results/plan/cpu-h100/observed.json").read_text())["rows"]
    assert [k["source"] for k in kept] == ["seed gpt_126m/1"] and kept[0]["measured_s"] > 0 < kept[0]["predicted_s"]
    assert (kept[0]["mbs"], kept[0]["gbs"]) == (2, 4)
    assert json.loads((ws / "results/plan/cpu-h100/calibration.json").read_text())["rows"][0]["measured_s"] > 0


@pytest.mark.slow
def test_recorded_h100_seed_scored_by_the_score_rules(tmp_path):
    """The H100 run's Megatron log (docs/measurements/megatron_h100/workflow_h100) through
    the real score_seed and score rules, on the device's system file; about 10 s."""
    ws = _workspace(tmp_path / "ws")
    recorded = workspace.REPO / "docs/measurements/megatron_h100/workflow_h100"
    seed = ws / "results/gpt_126m/seed_1"
    seed.mkdir(parents=True)
    shutil.copy(recorded / "seed_1_mllog.txt", seed / "mllog.txt")
    shutil.copy(recorded / "container.json", ws / "results/gpt_126m/container.json")
    run_snakemake(ws, "-c1", "results/gpt_126m/score.json", "--allowed-rules", "score_seed", "score", "reference",
                  "--config", "system=device-h100", "benchmarks=[gpt_126m]", timeout=300)
    run = json.loads((seed / "run.json").read_text())
    t = run["throughput"]
    # Megatron-LM's own figures (median of the logged intervals after the first), MFU against 989 TFLOP/s.
    assert (t["gpus"], t["global_batch_size"], t["seq_length"], t["tflops_source"]) == (1, 16, 2048, "logged")
    assert t["mfu"] == pytest.approx(t["tflops_per_gpu"] / 989) and 0.1 < t["mfu"] < 0.3
    assert t["tokens_per_s"] == pytest.approx(16 * 2048 / t["iter_time_s"])
    assert run["status"] == "success" and run["iteration_to_converge"] == 100 and run["curve"][-1][0] == 300
    # Recorded before issue 26 gave each Megatron run a fingerprint (its curve and times; copies are one run).
    assert isinstance(run.pop("fingerprint"), str)
    assert run == {**json.loads((recorded / "seed_1_run.json").read_text()), "file": run["file"]}
    score = json.loads((ws / "results/gpt_126m/score.json").read_text())
    assert score["valid"] and score["runs_counted"] == 1
