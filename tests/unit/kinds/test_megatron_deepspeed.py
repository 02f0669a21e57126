"""The Megatron-DeepSpeed kind (kinds.megatron_deepspeed): the guide's configs planned with their ds_config and
launch lines (golden files), the batch-size check before any job, the patches against the pinned source, and
the fork's log and tfevents scored on the Megatron-LM kind's FLOP count."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from mlrepro import config as mlrepro_config
from mlrepro import kinds
from mlrepro.kinds import megatron_deepspeed as kind
from mlrepro.plan import cost, workloads
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_deepspeed as mds
from mlrepro.pretrain import megatron_plan
from mlrepro.scoring import megatron_deepspeed_log as dslog
import workspace

ROOT = workspace.REPO
FIX = workspace.FIXTURES / "megatron_deepspeed"
GOLDEN = FIX / "golden"
CONFIGS = {"gpt_126m_deepspeed": ["gpt-125m", "gpt-125m-2xdp", "gpt-125m-4xdp"],
           "gpt_1p3b_deepspeed": ["gpt-1-3b-4xdp", "gpt-1-3b-8xdp", "gpt-1-3b-4xdp-4xpp"],
           "gpt_13b_deepspeed": ["gpt-13b-4xdp-4xpp", "gpt-13b-4xdp-8xpp", "gpt-13b-4xdp-4xpp-4xtp"],
           "gpt_175b_deepspeed": ["gpt-175b-tp8-pp16-dp4"]}
SLURM = "dgxh100-64x8"


def _settings(ws: Path, benchmark: str, system: str = SLURM, **pretrain) -> mlrepro_config.Settings:
    return mlrepro_config.load({"benchmarks": [benchmark], "system": system, "pretrain": pretrain}, ws)


def _lines(describe: str) -> list[str]:
    # The failures line is megatron_plan's (its own tests hold it); the golden holds what this kind adds.
    return [x for x in describe.split(" | ") if not x.startswith("failures:")]


@pytest.mark.parametrize("benchmark, layout", [(b, lay) for b, lays in CONFIGS.items() for lay in lays])
def test_the_guides_configs_plan_as_the_golden_files_say(tmp_path, benchmark, layout):
    """Each config's dry run on the Slurm cluster: the plan, its ds_config and the srun line a seed runs."""
    ws = workspace.make_workspace(tmp_path / "ws")
    settings = _settings(ws, benchmark, layout=layout)
    assert kinds.of(settings.benchmark(benchmark)) is kind
    plan = kind.dag_plan(settings, benchmark, 1)
    got = "\n".join(_lines(plan.description)) + "\n"
    golden = GOLDEN / f"{layout}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text()
    head, ds, line = got.splitlines()
    assert head.startswith(f"{layout} on {SLURM}: ") and "launch line of seed 1" in head
    config = json.loads(ds.split(": ", 1)[1])
    argv = shlex.split(line)
    flag = lambda name: int(argv[argv.index(name) + 1])  # noqa: E731
    lay = megatron_plan.variants(settings.benchmark(benchmark))[layout]
    assert config["train_batch_size"] == flag("--global-batch-size") == config["train_micro_batch_size_per_gpu"] * \
        config["gradient_accumulation_steps"] * lay.dp
    assert config["zero_optimization"]["stage"] == flag("--zero-stage") == lay.zero_stage
    assert (flag("--tensor-model-parallel-size"), flag("--pipeline-model-parallel-size")) == (lay.tp, lay.pp)
    assert argv[0] == "srun" and f"--nodes={plan.nodes}" in argv and plan.ranks == lay.tp * lay.pp * lay.dp
    assert set(mds.APEX_FREE) <= set(argv) and ("--no-pipeline-parallel" in argv) == (lay.pp == 1)
    assert not set(mds.NOT_IN_FORK) & set(argv)  # flags the fork's argparse would refuse


def test_the_13b_and_175b_dry_runs_on_the_slurm_cluster(tmp_path):
    ws = workspace.make_workspace(tmp_path / "ws")
    for benchmark, gpus in (("gpt_13b_deepspeed", 16), ("gpt_175b_deepspeed", 512)):
        plans = kinds.of(_settings(ws, benchmark).benchmark(benchmark)).dag_plans(_settings(ws, benchmark), benchmark)
        plan = plans[1]
        assert plan.scheduler == "slurm" and plan.ranks == gpus and plan.nodes == gpus // 8
        assert "--deepspeed --deepspeed_config" in plan.description 
        assert plan.sbatch is not None and str(plan.sbatch.render()[-1]).endswith("megatron_deepspeed/run.sub")


def test_a_seed_writes_its_ds_config_and_torchrun_line(tmp_path):
    from test_megatron_seed import _workspace  # the mini corpus the Megatron-LM seed tests prepare

    ws = _workspace(tmp_path / "ws")
    src = tmp_path / "mds"
    (src / "megatron").mkdir(parents=True)
    (src / "pretrain_gpt.py").write_text("")
    (src / "mlrepro_patches.json").write_text("{}")
    settings = _settings(ws, "gpt_126m_deepspeed", "device-h200x2", layout="gpt-125m-2xdp", train_iters=40,
                         megatron=str(src))
    plan = kind.prepare(settings, "gpt_126m_deepspeed", 1)
    assert plan.implementation_dir == ws / "implementations" / "megatron_deepspeed"
    config = json.loads((plan.seed_dir / "ds_config.json").read_text())
    argv = shlex.split(Path(plan.env["MEGATRON_LAUNCH_FILE"]).read_text())
    assert argv[:4] == ["torchrun", "--standalone", "--nproc-per-node=2", "pretrain_gpt.py"]
    assert argv[argv.index("--deepspeed_config") + 1] == str(plan.seed_dir / "ds_config.json")
    assert argv[argv.index("--tensorboard-dir") + 1] == str(plan.seed_dir / "tensorboard")
    assert config["train_batch_size"] == int(argv[argv.index("--global-batch-size") + 1])
    assert (Path(plan.env["MEGATRON_DIR"]) / "pretrain_gpt.py").is_file()
    # attention: sdpa (as the Megatron-LM seeds take it) is the fork's flash path, on torch's SDPA (patch 0011),
    # in the seed's line and the dry run's alike
    assert "--use-flash-attn-v2" not in argv
    sdpa = _settings(ws, "gpt_126m_deepspeed", "device-h200x2", layout="gpt-125m-2xdp", train_iters=40,
                     megatron=str(src), attention="sdpa")
    assert "--use-flash-attn-v2" in shlex.split(kind.plan_seed(sdpa, "gpt_126m_deepspeed", 1).env["MEGATRON_LINE"])
    assert "--use-flash-attn-v2" in kind.dag_plan(sdpa, "gpt_126m_deepspeed", 1).description


def test_a_ds_config_that_disagrees_with_the_launch_line_stops_the_dag(tmp_path):
    """A layout's ds_config: block with another micro-batch: refused at DAG time, naming the key."""
    ws = workspace.make_workspace(tmp_path / "ws")
    path = ws / "config" / "benchmarks" / "gpt_126m_deepspeed.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["pretrain"]["layouts"][0]["ds_config"] = {"train_micro_batch_size_per_gpu": 4}
    path.write_text(yaml.safe_dump(doc))
    settings = _settings(ws, "gpt_126m_deepspeed")
    with pytest.raises(mlrepro_config.ConfigError, match=r"gpt_126m_deepspeed.yaml layout gpt-125m: ds_config "
                       r"train_batch_size 256 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 32"):
        kind.dag_plans(settings, "gpt_126m_deepspeed")
    doc["pretrain"]["layouts"][0]["ds_config"] = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 64}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(mlrepro_config.ConfigError, match=r"train_micro_batch_size_per_gpu 4 != the launch line's "
                       r"--micro-batch-size 8"):
        kind.dag_plans(_settings(ws, "gpt_126m_deepspeed"), "gpt_126m_deepspeed")


def test_a_ds_config_block_of_the_wrong_type_is_rejected_by_the_schema(tmp_path):
    ws = workspace.make_workspace(tmp_path / "ws")
    path = ws / "config" / "benchmarks" / "gpt_126m_deepspeed.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["pretrain"]["layouts"][0]["ds_config"] = "ds.json"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(mlrepro_config.ConfigError, match="ds_config"):
        _settings(ws, "gpt_126m_deepspeed").benchmark("gpt_126m_deepspeed")


def test_the_patches_apply_to_the_pinned_source_and_remove_apex(tmp_path):
    """On the pinned source (what pretrain_gpt.py needs of it: CI has no mirror), then no apex, amp_C, top-level
    torchvision or transformers import is left in the files the patches touch (megatron/model/fused_layer_norm.py
    keeps its apex import: 0001 stops megatron/model/__init__.py importing it) and fused_kernels.load is behind
    --masked-softmax-fusion."""
    with tarfile.open(FIX / "source_4efb479.tar.gz") as tar:
        tar.extractall(tmp_path)
    pin = yaml.safe_load((ROOT / "config/benchmarks/gpt_126m_deepspeed.yaml").read_text())["pretrain"]["megatron"]
    assert pin["commit"].startswith("4efb479")
    applied = mds.apply_patches(ROOT, tmp_path)
    assert applied == [p.name for p in sorted((ROOT / mds.PATCHES).glob("*.patch"))]
    assert all(mds.reasons(ROOT).values())
    touched = {tmp_path / line.removeprefix("+++ b/") for patch in mds.series(ROOT)
               for line in patch.read_text().splitlines() if line.startswith("+++ b/")}
    assert len(touched) == 13
    text = {p: p.read_text() for p in touched}
    assert not [p for p, t in text.items() if "from apex" in t or "import amp_C" in t]
    assert "fused_layer_norm" not in text[tmp_path / "megatron/model/__init__.py"]
    assert "from transformers import" not in text[tmp_path / "megatron/tokenizer/tokenizer.py"].split("class ")[0]
    assert "knn_monitor" not in text[tmp_path / "megatron/training.py"].split("\ndef ")[0]
    # DeepSpeed 0.19 has no deepspeed.compression.compress (a 2xH200 run died importing it): only where asked for
    assert "deepspeed.compression.compress" not in text[tmp_path / "megatron/training.py"].split("\ndef ")[0]
    assert "if build:" in text[tmp_path / "megatron/initialize.py"]
    # found on the first GPU and CPU runs: strided QKV slices reshaped, LOCAL_RANK from the launcher, and no
    # compiled dataset helper (its build_sample_idx died on the GPU image)
    assert "query_layer.reshape(output_size[2]" in text[tmp_path / "megatron/model/transformer.py"]
    assert 'os.environ.get("LOCAL_RANK"' in text[tmp_path / "megatron/initialize.py"]
    assert "compile_helper()" not in text[tmp_path / "megatron/initialize.py"]
    # --use-flash-attn-v2 without the flash-attn package: torch's SDPA (the workflow's attention: sdpa)
    assert "scaled_dot_product_attention" in text[tmp_path / "megatron/model/transformer.py"]
    assert "helpers." not in text[tmp_path / "megatron/data/gpt_dataset.py"] + text[tmp_path / "megatron/data/blendable_dataset.py"]


def test_a_patch_that_does_not_apply_changes_nothing(tmp_path):
    with tarfile.open(FIX / "source_4efb479.tar.gz") as tar:
        tar.extractall(tmp_path)
    mds.apply_patches(ROOT, tmp_path)
    before = (tmp_path / "megatron/utils.py").read_text()
    with pytest.raises(Exception, match="0001-layernorm-torch.patch does not apply"):
        mds.apply_patches(ROOT, tmp_path)
    assert (tmp_path / "megatron/utils.py").read_text() == before


MIRROR = Path("/work/.mirror/deepspeedai+Megatron-DeepSpeed/repo")


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no mirror of deepspeedai/Megatron-DeepSpeed here")
def test_the_patches_apply_to_the_whole_pinned_tree(tmp_path):
    archive = subprocess.run(["git", "-C", str(MIRROR), "archive", "4efb479d5317ce9b86096b9d8e3e8030b0b5263b"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    assert len(mds.apply_patches(ROOT, tmp_path)) == len(mds.series(ROOT)) == 11


def test_the_log_and_tfevents_parse_as_the_fork_writes_them():
    """On a cut of a real run (2xdp on two H200s, 400 iterations, tests/fixtures/megatron_deepspeed/cut_fixture.py):
    every logged interval and validation, the training clock within the log's own start and end stamps, and the
    events' wall clock anchored on a logged iteration (the fork writes a training event every iteration)."""
    parsed = dslog.parse_log(FIX / "training.log")
    log = parsed.log
    assert [i.iteration for i in log.iterations] == list(range(10, 401, 10))
    assert [(v.iteration, v.loss) for v in log.validations] == [(100, 3.436509), (200, 3.44802), (300, 3.441393),
                                                                (400, 3.437348)]
    assert parsed.consumed_tokens[400] == 400 * 16 * 2048 and parsed.logged_tflops_per_gpu[30] == 57.34
    assert parsed.time_source == "training clock"
    # "[after training is done] datetime: 20:50:40", 89 s after the start: the logged iteration times fit inside
    clock = (log.iterations[-1].time - log.start).total_seconds()
    assert 80 < clock <= 89
    scalars = dslog.read_scalars(FIX / "tfevents" / "events.out.tfevents.fixture")
    assert {s.tag for s in scalars} == {dslog.TRAIN_TAG, dslog.VALID_TAG, dslog.ITER_TIME_TAG}
    assert sorted(s.step for s in scalars if s.tag == dslog.TRAIN_TAG) == list(range(1, 401))
    assert [s.step for s in scalars if s.tag == dslog.VALID_TAG] == [100, 200, 300, 400]
    with_events = dslog.parse_log(FIX / "training.log", [FIX / "tfevents" / "events.out.tfevents.fixture"])
    assert with_events.time_source == "tfevents wall clock"
    # wall clock: the evaluations' time counts, so the last validation ends after the last logged iteration and
    # before the log's end stamp (whole seconds: 89 s, so under 90)
    last = (with_events.log.validations[-1].time - log.start).total_seconds()
    assert clock < last < 90


def test_a_cut_tfevents_file_yields_what_it_holds(tmp_path):
    """The run's file ends with iteration 400's validation twice (at its interval, then on the final draw; the
    later one counts): cut inside the second-last record, both are gone and nothing else changes."""
    data = (FIX / "tfevents" / "events.out.tfevents.fixture").read_bytes()
    (tmp_path / "cut").write_bytes(data[: len(data) - 150])
    whole, cut = dslog.read_scalars(FIX / "tfevents" / "events.out.tfevents.fixture"), dslog.read_scalars(tmp_path / "cut")
    assert [s.value for s in whole if s.tag == dslog.VALID_TAG][-1] == pytest.approx(3.435838)  # the draw's
    assert 0 < len(cut) == len(whole) - 1 and set(cut) < set(whole)
    assert [s.step for s in cut if s.tag == dslog.VALID_TAG] == [100, 200, 300]


def test_the_score_counts_flops_as_the_megatron_lm_kind_does():
    """The fork's TFLOPs count differently; its runs are counted as Megatron-LM counts (num_floating_point_operations
    on the arguments the log prints, the vocabulary padded): on the Megatron-LM run recorded beside it (gpt_126m on
    an H200, the same model and corpus) that count is Megatron-LM's own logged TFLOP/s x time on every line."""
    import re

    from mlrepro.scoring import megatron_log, megatron_score

    mg = ROOT / "docs/measurements/megatron_deepspeed/h200x2_acceptance/mg/mllog.txt"
    counted = megatron_score.flops_per_iteration(megatron_log.parse_log(mg), 16)
    logged = [float(ms) / 1e3 * float(tf) * 1e12 for ms, tf in re.findall(
        r"elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)", mg.read_text())]
    assert len(logged) == 41 and all(x == pytest.approx(counted, rel=0.003) for x in logged)
    flops = kind.model_flops_per_iter(FIX / "training.log", "gpt-126m", 16, 1)
    assert flops == counted  # the fork's log: the same model, vocabulary 554 padded to 640
    record = dslog.training_record(FIX / "training.log", target_loss=4.0, gpus=2, seq_length=2048, gpu="NVIDIA H200",
                                   model_flops_per_iter=flops,
                                   tfevents=[FIX / "tfevents" / "events.out.tfevents.fixture"])
    assert record.converged and record.counted and record.iteration_to_converge == 100  # 3.4365 at the first
    t = record.throughput
    # the fork's own TFLOPs (its count) kept beside
    assert t["tflops_source"] == "model" and 50 < t["logged_tflops_per_gpu"] < 60
    assert t["tflops_per_gpu"] == pytest.approx(flops / t["iter_time_s"] / 2 / 1e12)
    assert t["tokens_per_s"] == pytest.approx(16 * 2048 / t["iter_time_s"]) and 0 < t["mfu"] < 1
    assert 0.2 < t["iter_time_s"] < 0.23  # the log's steady 212 ms (the first interval, 313 ms, left out)
    # a log without the model's arguments: the planner's count of the model
    assert kind.model_flops_per_iter(FIX / "tfevents" / "events.out.tfevents.fixture", "gpt-126m", 16, 1) == \
        cost.model_flops_per_step(workloads.gpt("gpt-126m", 16), Layout(mbs=16))


def test_segment_end_reads_the_forks_save_message():
    """A chained seed's job end: segment_end.py (shared with the Megatron-LM kind) knows the fork's own words."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("segment_end", ROOT / "implementations/megatron_deepspeed/segment_end.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seg = module.Segment()
    seg.feed("  successfully saved checkpoint at iteration      40 to /seed/checkpoints")
    assert seg.saved == 40


def test_a_chained_seeds_log_is_its_jobs_logs_as_one_run(tmp_path):
    """The chained gpt_126m_deepspeed seed on an H200 (four jobs, each ended by the fork's 1-minute clock;
    docs/measurements/megatron_deepspeed/h200x2_acceptance/dsc/): the seed's log holds every step once under
    one start, so its throughput is the steady 0.41 s of all jobs (the last job's own log held 3 iterations,
    one interval, read as 0.59 s), and it passes the log rules that refuse two runs in one log."""
    from mlrepro.kinds import megatron as megatron_kind
    from mlrepro.scoring import integrity

    run = ROOT / "docs/measurements/megatron_deepspeed/h200x2_acceptance/dsc"
    for k in range(1, 5):
        (tmp_path / f"attempt_{k}").mkdir()
        (tmp_path / f"attempt_{k}" / "run.log").write_text((run / f"attempt_{k}_run.log").read_text())
    (tmp_path / "segments.json").write_text((run / "segments.json").read_text())
    last = (run / "attempt_4_run.log").read_text()
    (tmp_path / "seed.log").write_text(megatron_kind.chained_log(tmp_path, last))
    parsed = dslog.parse_log(tmp_path / "seed.log")
    assert [i.iteration for i in parsed.log.iterations] == list(range(10, 401, 10))
    assert len(parsed.log.starts) == 1 and integrity.training_log_problems(parsed.log) == []
    record = dslog.training_record(tmp_path / "seed.log", target_loss=4.0, gpus=1, seq_length=2048,
                                   model_flops_per_iter=kind.model_flops_per_iter(tmp_path / "seed.log", "gpt-126m", 16, 1))
    assert record.throughput["iter_time_s"] == pytest.approx(0.409, abs=0.005)
    assert record.iteration_to_converge == 100 and record.converged
    # without segments.json the seed is not chained: its log is the run's own
    (tmp_path / "segments.json").unlink()
    assert megatron_kind.chained_log(tmp_path, last) == last


def test_steps_a_killed_job_trained_past_its_save_count_once(tmp_path):
    """A job killed at iteration 30 after saving at 20: the next resumed from 20 and logged 30 again; the
    seed's log keeps the first job's lines to its save and the second's from its start of training."""
    from mlrepro.kinds import megatron as megatron_kind

    lines = (FIX / "training.log").read_text().splitlines()
    start = next(x for x in lines if x.startswith("[before the start of training step]"))
    its = {int(x.split("/")[0].split()[-1]): x for x in lines if x.lstrip().startswith("iteration")}
    saved = "  successfully saved checkpoint at iteration      20 to /seed/checkpoints"
    first = "\n".join(["header", start, its[10], its[20], saved, its[30], "Killed"]) + "\n"
    second = "\n".join(["header again", start, its[30], its[40]]) + "\n"
    (tmp_path / "attempt_1").mkdir()
    (tmp_path / "attempt_1" / "run.log").write_text(first)
    (tmp_path / "attempt_2").mkdir()
    (tmp_path / "segments.json").write_text('{"segments": []}')
    text = megatron_kind.chained_log(tmp_path, second)
    assert text.count(its[30]) == 1 and text.count(start) == 1 and "Killed" not in text and "header again" not in text
    assert [i.iteration for i in dslog.parse_lines(text.splitlines()).log.iterations] == [10, 20, 30, 40]
