"""Megatron-LM GPT benchmarks: dry-run plans on the example systems, refusals, and the seeds' launchers."""

from __future__ import annotations

import json
import re
import shlex
import shutil

import numpy as np
import pytest

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.corpus import blend, minicorpus
from mlrepro.formats import indexed
from mlrepro.plan import hardware
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_launch, megatron_plan
import workspace

ROOT = workspace.REPO
PINNED = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


@pytest.fixture
def corpus(tmp_path):
    """A blend written by the corpus stage's own write_blend over two real .bin/.idx prefixes, and
    the tokenizer the mini corpus trains."""
    out = tmp_path / "mini_corpus"
    minicorpus.train_gpt2_bpe(minicorpus.documents(50, seed=1), out / "tokenizer", vocab_size=300)
    prefixes = []
    for name, n in (("train_chunk_0_text_document", 300), ("train_chunk_1_text_document", 100)):
        prefix = out / "preprocessed" / name
        prefix.parent.mkdir(parents=True, exist_ok=True)
        w = indexed.IndexedWriter(f"{prefix}.bin")
        w.add_document(np.arange(n, dtype=np.uint16))
        w.finalize(f"{prefix}.idx")
        prefixes.append(str(prefix))
    blend.write_blend(prefixes, out / "data_prefix.json")
    return out


def _render(benchmark, system, corpus, variant=None):
    return megatron_plan.render(ROOT, benchmark, system, variant, corpus)


def test_plans_print_shape_layout_walltime_and_launch_line(corpus):
    text, refused = _render("gpt_13b", "dgxh100-64x8", corpus, "gpt-13b-4xdp-4xpp-4xtp")
    assert not refused
    head, failures, sbatch, srun = text.splitlines()
    assert failures.strip().startswith("failures: MTBF 461.5 h on 8 node(s)")  # 6.5 per 1,000 node-days
    assert head.startswith("gpt-13b-4xdp-4xpp-4xtp on dgxh100-64x8: 8 node(s) x 8 GPUs (64 x NVIDIA H100 80GB HBM3)")
    assert "layout TP4 PP4 DP4 " in head and "(GBS 1024)" in head
    first = mlrepro_config.load_benchmark(ROOT, "gpt_13b").seeds[0]  # whose line the plan shows
    assert re.search(rf"wall time \d+-\d\d:\d\d:00; launch line of seed {first}$", head)
    # 260B tokens / (1024 x 2048) iterations
    assert "123,978 iterations" in head
    assert sbatch.split()[:5] == ["sbatch", "-N", "8", "--ntasks-per-node=8", "--gpus-per-node=8"]
    argv = shlex.split(srun)
    assert argv[:4] == ["srun", "--mpi=pmix", "--nodes=8", "--ntasks-per-node=8"]
    assert "--container-image=${CONT}" in argv and any(a.startswith("--container-mounts=") for a in argv)
    i = argv.index("--tensor-model-parallel-size")
    assert argv[i + 1] == "4" and argv[argv.index("--pipeline-model-parallel-size") + 1] == "4"
    d = argv.index("--data-path")
    assert argv[d + 1: d + 5] == ["0.75", "/data/preprocessed/train_chunk_0_text_document",
                                  "0.25", "/data/preprocessed/train_chunk_1_text_document"]
    # The data is pretokenized: Megatron gets the corpus tokenizer's vocabulary size, not its files.
    vocab = len(json.loads((corpus / "tokenizer" / "vocab.json").read_text()))
    assert argv[argv.index("--tokenizer-type") + 1: argv.index("--tokenizer-type") + 4] == [
        "NullTokenizer", "--vocab-size", str(vocab)]
    assert argv[argv.index("--seed") + 1] == str(first)


def test_a_plan_renders_before_the_corpus_stages_have_run(tmp_path):
    """A dry run comes before the corpus exists: the line shows UNPREPARED where the blend and the
    vocabulary size will be, and says so."""
    missing = tmp_path / "mini_corpus"
    text, refused = _render("gpt_126m", "dgxh100-64x8", missing, "gpt-125m")
    assert not refused
    note, head, _failures, sbatch, srun = text.splitlines()
    assert str(missing / "data_prefix.json") in note and str(missing / "tokenizer" / "vocab.json") in note
    argv = shlex.split(srun)
    assert argv[argv.index("--data-path") + 2] == "/data/preprocessed/UNPREPARED"
    assert argv[argv.index("--vocab-size") + 1] == "UNPREPARED"


@pytest.mark.parametrize("benchmark", ["gpt_126m", "gpt_126m_deepspeed", "gpt_1p3b", "gpt_8b", "gpt_8b_nemo",
                                       "gpt_13b", "gpt_175b"])
def test_every_layout_plans_on_the_h100_cluster(benchmark, corpus):
    text, refused = _render(benchmark, "dgxh100-64x8", corpus)
    assert not refused
    names = [v for v in megatron_plan.variants(mlrepro_config.load_benchmark(ROOT, benchmark))]
    for name in names:
        assert re.search(rf"^{re.escape(name)} on dgxh100-64x8: \d+ node\(s\) x \d+ GPUs", text, re.M), name


def test_impossible_layouts_are_refused_naming_why(corpus):
    text, refused = _render("gpt_1p3b", "dgxb200", corpus)
    assert "gpt-1-3b-8xdp on dgxb200: 1 node(s) x 8 GPUs" in text
    assert "gpt-1-3b-4xdp-4xpp needs 16 GPUs (TP1 x PP4 x DP4); dgxb200 has 8" in refused
    _, refused = _render("gpt_175b", "dgxb200", corpus, "gpt-175b-planned")
    assert "above 180 GB x 0.95" in refused[0] and "gpt-175b" in refused[0]
    facts = hardware.load(ROOT, "dgxh100-64x8")
    odd = megatron_plan.Variant("gpt_126m", "tp5", "gpt-126m", 2.5e9, 256, tp=5, pp=1, dp=1)
    with pytest.raises(megatron_plan.Refused, match=r"tp5 \(TP5 PP1 DP1\) breaks a rule: attention heads .* 12 heads"):
        megatron_plan.plan(odd, facts)
    odd = megatron_plan.Variant("gpt_126m", "pp5", "gpt-126m", 2.5e9, 256, tp=1, pp=5, dp=8)
    with pytest.raises(megatron_plan.Refused, match=r"pp5 \(TP1 PP5 DP8\) breaks a rule: layers not divisible by PP"):
        megatron_plan.plan(odd, facts)
    wide = megatron_plan.Variant("gpt_175b", "tp16", "gpt-175b", 3.5e12, 1536, tp=16, pp=8, dp=4)
    with pytest.raises(megatron_plan.Refused, match=r"TP group larger than the NVLink domain \(TP16 > 8 GPUs\)"):
        megatron_plan.plan(wide, facts)
    odd = megatron_plan.Variant("gpt_126m", "dp12", "gpt-126m", 2.5e9, 256, tp=1, pp=1, dp=12)
    with pytest.raises(megatron_plan.Refused, match="12 GPUs is not a whole number of 8-GPU nodes"):
        megatron_plan.plan(odd, facts)


def test_cli_exit_codes(corpus, capsys):
    argv = ["gpt_1p3b", "--system", "dgxb200", "--root", str(ROOT), "--corpus-dir", str(corpus)]
    assert megatron_plan.main(argv + ["--variant", "gpt-1-3b-4xdp-4xpp"]) == 2
    assert "needs 16 GPUs" in capsys.readouterr().err
    assert megatron_plan.main(argv) == 0  # two of the layouts fit; the others are listed as refused
    assert megatron_plan.main(["gpt_1p3b", "--system", "local-slurm", "--root", str(ROOT)]) == 2
    assert "hardware.gpu_memory_gb" in capsys.readouterr().err


def test_nemo_variant_renders_the_nemo_guides_command(corpus):
    text, _ = _render("gpt_8b_nemo", "dgxh100-64x8", corpus, "nemo-7b-improved-8x8")
    head, _failures, cmd = text.splitlines()
    assert "8 node(s) x 8 GPUs" in head and "TP2 PP1 DP32" in head and "300,000 iterations" in head
    argv = cmd.split()
    assert argv[:5] == ["python3", "/opt/NeMo-Megatron-Launcher/launcher_scripts/main.py", "stages=[training]",
                        "training=gpt3/7b_improved",
                        "launcher_scripts_path=/opt/NeMo-Megatron-Launcher/launcher_scripts"]
    assert "training.trainer.num_nodes=8" in argv
    assert ("training.model.data.data_prefix=[0.75,'/data/preprocessed/train_chunk_0_text_document',"
            "0.25,'/data/preprocessed/train_chunk_1_text_document']") in argv
    limit = re.search(r'time_limit="(\d+)-(\d\d):(\d\d):00"', cmd).groups()
    stop = re.search(r'max_time="(\d+):(\d\d):(\d\d):00"', cmd).groups()
    minutes = lambda d, h, m: (int(d) * 24 + int(h)) * 60 + int(m)  # noqa: E731
    assert minutes(*limit) - minutes(*stop) == 30  # the NeMo guide: stop 30-60 min before the job limit


def test_deepspeed_variant_renders_ds_config(corpus):
    text, _ = _render("gpt_126m_deepspeed", "dgxh100-64x8", corpus, "gpt-125m-4xdp")
    head, _failures, ds, cmd = text.splitlines()
    config = json.loads(ds.split(": ", 1)[1])
    assert ds.strip().startswith("ds_config.json (gpt-125m-4xdp.yaml)")
    assert config["train_batch_size"] == 256
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 4
    argv = shlex.split(cmd)  # the line kinds.megatron_deepspeed runs (tests/unit/kinds/test_megatron_deepspeed.py)
    assert argv[:2] == ["srun", "--mpi=pmix"] and "--ntasks-per-node=4" in argv
    assert argv[-5:] == ["--deepspeed", "--deepspeed_config", "ds_config.json", "--zero-stage", "1"]


def test_local_launch_is_torchrun_one_process_per_gpu():
    run = megatron_launch.Run("gpt-126m", Layout(dp=2, mbs=4, ga=2), 50, data_prefix=(1.0, "/d/x_text_document"),
                              pretokenized_vocab=27169, sdpa=True)
    argv = shlex.split(megatron_launch.torchrun_line(run))
    assert argv[:4] == ["torchrun", "--standalone", "--nproc-per-node=2", "pretrain_gpt.py"]
    assert argv[argv.index("--global-batch-size") + 1] == "16"
    assert argv[argv.index("--tokenizer-type") + 1: argv.index("--tokenizer-type") + 4] == [
        "NullTokenizer", "--vocab-size", "27169"]
    assert argv[-3:] == ["--spec", "sdpa_spec", "sdpa_layer_spec"]
    assert "--transformer-impl" in argv and "--no-gradient-accumulation-fusion" in argv


def test_recorded_device_launch_lines_are_what_the_module_renders():
    for arm, sdpa in (("sdpa", True), ("unfused", False)):
        recorded = (ROOT / "device" / f"launch_{arm}.sh").read_text().strip()
        run = megatron_launch.Run("gpt-126m", Layout(mbs=8, ga=2), 300, data_prefix=(1.0, "/tmp/data/corpus_text_document"),
                                  pretokenized_vocab=27169, warmup_iters=30, sdpa=sdpa)
        assert megatron_launch.torchrun_line(run) == recorded


def test_pinned_commit_is_one_everywhere():
    for path in sorted((ROOT / "config" / "benchmarks").glob("gpt_*.yaml")):
        data = mlrepro_config.load_yaml(path)
        # Megatron-DeepSpeed's benchmarks pin that fork (tests/unit/kinds/test_megatron_deepspeed.py)
        pinned = "4efb479d5317ce9b86096b9d8e3e8030b0b5263b" if path.stem.endswith("_deepspeed") else PINNED
        assert data["pretrain"]["megatron"]["commit"] == pinned, path
    impl = ROOT / "implementations" / "megatron_gpt"
    assert f"MEGATRON_COMMIT={PINNED}" in (impl / "Dockerfile").read_text()
    assert f"MEGATRON_COMMIT={PINNED}" in (impl / "config_common.sh").read_text()


def test_schema_rejects_bad_pretrain_block(tree):
    shutil.copytree(ROOT / "implementations" / "megatron_gpt", tree / "implementations" / "megatron_gpt")
    path = tree / "config" / "benchmarks" / "gpt_13b.yaml"
    path.write_text(path.read_text().replace("{name: gpt-13b-4xdp-8xpp, tp: 1", "{name: gpt-13b-4xdp-8xpp, tq: 1"))
    with pytest.raises(mlrepro_config.ConfigError, match=r"gpt_13b.yaml.*\n.*pretrain.layouts.1.*tq"):
        mlrepro_config.load_benchmark(tree, "gpt_13b")
    assert mlrepro_config.load_benchmark(tree, "gpt_126m").name == "gpt_126m"


def test_the_plan_command_reads_the_validated_benchmark(tree, capsys):
    """A pretrain: block the schema refuses is refused by the plan command too, naming the key."""
    shutil.copytree(ROOT / "implementations" / "megatron_gpt", tree / "implementations" / "megatron_gpt")
    path = tree / "config" / "benchmarks" / "gpt_13b.yaml"
    path.write_text(path.read_text().replace("{name: gpt-13b-4xdp-8xpp, tp: 1", "{name: gpt-13b-4xdp-8xpp, tq: 1"))
    assert megatron_plan.main(["gpt_13b", "--system", "dgxh100-64x8", "--root", str(tree)]) == 2
    assert re.search(r"refused: .*gpt_13b.yaml is invalid:\n.*pretrain.layouts.1.*tq", capsys.readouterr().err)


def test_a_seeds_plan_is_shaped_by_the_workflow_overrides(corpus):
    """What the dry run shows of a GPT seed is what megatron_seed runs: the pretrain: overrides' shape and job limit."""
    bench = mlrepro_config.load_benchmark(ROOT, "gpt_126m")
    default = megatron_plan.dry_run(ROOT, bench, "device-h100", corpus_dir=corpus)
    short = megatron_plan.dry_run(ROOT, bench, "device-h100", {"train_iters": 30, "gbs": 4, "mbs": 2}, corpus)
    # the planner prices a micro-batch of 1 below a GEMM of 8 (cost.default_gemm_shape): MBS8 for GPT-126M
    assert "MBS8 GA32 (GBS 256)" in default.describe and "MBS2 GA2 (GBS 4)" in short.describe
    assert " 30 iterations x " in short.describe and short.walltime_minutes < default.walltime_minutes
    assert megatron_plan.dry_run(ROOT, bench, "device-h100", {"walltime_minutes": 7}, corpus).walltime_minutes == 7
    with pytest.raises(mlrepro_config.ConfigError, match="gbs 5 is not a multiple of mbs 2"):
        megatron_plan.dry_run(ROOT, bench, "device-h100", {"gbs": 5, "mbs": 2}, corpus)


def test_model_family_flags():
    gpt = megatron_launch.model_args("gpt-126m", Layout())
    assert "--swiglu" not in gpt and "--position-embedding-type" not in gpt
    big = megatron_launch.model_args("gpt-8b", Layout(tp=2))
    assert big[big.index("--ffn-hidden-size") + 1] == "10880"
    assert {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"} <= set(big)
    assert big[big.index("--position-embedding-type") + 1] == "rope"


def test_one_machine_gets_torchrun(tree, corpus):
    shutil.copytree(ROOT / "implementations" / "megatron_gpt", tree / "implementations" / "megatron_gpt")
    (tree / "config" / "systems" / "h100-box.yaml").write_text(
        "name: h100-box\nscheduler: local\nnodes: 1\ngpus_per_node: 1\ndevice: cuda\ncontainer_runtime: none\n"
        "hardware: {gpu: NVIDIA H100 80GB HBM3, gpu_memory_gb: 80, peak_tflops_bf16: 989, nvlink_domain_gpus: 1,\n"
        "           nvlink_busbw_gbs: 1, network_busbw_gbs: 1}\n")
    text, refused = megatron_plan.render(tree, "gpt_126m", "h100-box", None, corpus)
    assert "gpt-125m on h100-box: 1 node(s) x 1 GPUs" in text
    launch = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("torchrun")]
    assert launch and shlex.split(launch[0])[:3] == ["torchrun", "--standalone", "--nproc-per-node=1"]
    assert refused == ["gpt-125m-2xdp needs 2 GPUs (TP1 x PP1 x DP2); h100-box has 1",
                       "gpt-125m-4xdp needs 4 GPUs (TP1 x PP1 x DP4); h100-box has 1",
                       "gpt-125m-2xtp needs 2 GPUs (TP2 x PP1 x DP1); h100-box has 1"]


def test_deterministic_mode_is_in_the_line_the_seed_runs_and_the_dry_run_shows(corpus):
    """`pretrain: {deterministic: true}` adds Megatron-LM's --deterministic-mode to the launch line, in the dry run
    as in the seed's own run (one builder); without it the line is unchanged."""
    bench = mlrepro_config.load_benchmark(ROOT, "gpt_126m")
    plain = megatron_plan.dry_run(ROOT, bench, "device-h100", corpus_dir=corpus).describe
    exact = megatron_plan.dry_run(ROOT, bench, "device-h100", {"deterministic": True}, corpus).describe
    assert "--deterministic-mode" not in plain
    assert exact.replace(" --deterministic-mode", "") == plain
    p = megatron_plan.shaped(megatron_plan.chosen(ROOT, bench, "device-h100", {}), {})
    run = megatron_plan.seed_run(p, 1, corpus, "local", deterministic=True)
    assert megatron_launch.pretrain_args(run)[-1] == "--deterministic-mode"


def test_a_chained_seeds_dry_run_shows_its_save_load_and_interval(corpus):
    """gpt_13b checkpoints (`segments:`): the dry run's launch line is the seed's own, with --save/--load of the
    seed's checkpoints/ and --save-interval the failures line gives; a benchmark without segments has none."""
    bench = mlrepro_config.load_benchmark(ROOT, "gpt_13b")
    plan = megatron_plan.dry_run(ROOT, bench, "dgxh100-64x8", corpus_dir=corpus).describe
    argv = shlex.split(plan.split(" | ")[-1])
    checkpoints = str(paths.SeedPaths.of(ROOT, "gpt_13b", 1).checkpoints)
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == checkpoints
    every = int(re.search(r"checkpoint every ([\d,]+) iterations", plan).group(1).replace(",", ""))
    assert int(argv[argv.index("--save-interval") + 1]) == every
    unchained = megatron_plan.dry_run(ROOT, mlrepro_config.load_benchmark(ROOT, "gpt_126m"), "device-h100",
                                      corpus_dir=corpus).describe
    assert "--save" not in shlex.split(unchained.split(" | ")[-1])
