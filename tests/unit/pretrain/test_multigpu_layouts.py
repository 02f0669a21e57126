"""Several GPUs through the workflow (issue 23): the layout a GPT seed runs on a 2- or 4-GPU system."""

from pathlib import Path

import pytest

from mlrepro import config
from mlrepro.pretrain import megatron_plan

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpt_126m():
    return config.load_benchmark(ROOT, "gpt_126m")


@pytest.mark.parametrize("layout, shape", [
    (None, (1, 1, 1)),              # the benchmark's first layout that fits: one GPU of the two
    ("gpt-125m-2xdp", (1, 1, 2)),   # the Megatron-DeepSpeed guide's "2x DP" row
    ("gpt-125m-2xtp", (2, 1, 1)),
])
def test_the_workflow_names_the_layout_a_seed_runs(gpt_126m, layout, shape):
    lay = megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": layout}).layout
    assert (lay.tp, lay.pp, lay.dp) == shape


def test_a_layout_that_does_not_fit_or_does_not_exist_is_refused_by_name(gpt_126m):
    with pytest.raises(megatron_plan.Refused, match="gpt-125m-4xdp needs 4 GPUs .* device-h200x2 has 2"):
        megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-4xdp"})
    with pytest.raises(megatron_plan.Refused, match="no such layout; it has gpt-125m, gpt-125m-2xdp"):
        megatron_plan.chosen(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-8xdp"})
    assert megatron_plan.chosen(ROOT, gpt_126m, "device-h100x4", {"layout": "gpt-125m-4xdp"}).layout.dp == 4


def test_the_dry_run_shows_the_named_layout(gpt_126m, tmp_path):
    plan = megatron_plan.dry_run(ROOT, gpt_126m, "device-h200x2", {"layout": "gpt-125m-2xtp", "gbs": 16, "mbs": 8},
                                   corpus_dir=tmp_path)
    assert "layout TP2 PP1 DP1 MBS8 GA2 (GBS 16)" in plan.describe
    assert "--tensor-model-parallel-size 2" in plan.describe and "--nproc-per-node=2" in plan.describe


def test_tensor_parallel_without_te_or_apex_runs_without_sequence_parallelism():
    """Megatron's local layer refuses --sequence-parallel (torch LayerNorm): the 2x TP seed died at start."""
    from mlrepro.plan.layout import Layout
    from mlrepro.pretrain import megatron_launch

    lay = Layout(tp=2, sp=True, mbs=8, ga=2)
    local = megatron_launch.pretrain_args(megatron_launch.Run("gpt-126m", lay, 10))
    te = megatron_launch.pretrain_args(megatron_launch.Run("gpt-126m", lay, 10, local_impl=False))
    assert "--sequence-parallel" not in local and "--sequence-parallel" in te
