"""A local seed runs on the GPUs its workflow was given (issue 23): submitit's LocalExecutor numbers them
from 0 whatever CUDA_VISIBLE_DEVICES says, and a two-lane run on a 4-GPU machine trained on GPUs 0,1 twice."""

import pytest

from mlrepro.launch import local
from mlrepro.launch.job import SeedFailed


@pytest.mark.parametrize("parent, gpus, expected", [
    (None, 2, {}),                                   # nothing given: submitit's 0..n-1 stands
    ("2,3", 2, {"CUDA_VISIBLE_DEVICES": "2,3"}),
    ("2,3", 1, {"CUDA_VISIBLE_DEVICES": "2"}),       # a one-GPU seed takes the first it was given
    ("GPU-aa,GPU-bb", 1, {"CUDA_VISIBLE_DEVICES": "GPU-aa"}),
    ("1", 0, {}),                                    # a CPU seed
])
def test_the_seed_gets_the_gpus_its_workflow_was_given(parent, gpus, expected):
    assert local.given_gpus(parent, gpus) == expected


def test_too_few_gpus_given_fails_the_seed_by_name():
    with pytest.raises(SeedFailed, match=r"needs 2 GPU\(s\); CUDA_VISIBLE_DEVICES='3' gives 1"):
        local.given_gpus("3", 2)


def test_the_quick_preflight_in_the_job_measures_the_given_gpus(tmp_path, monkeypatch):
    """The quick preflight runs in submitit's job process (GPUs renumbered from 0): it must see the GPUs
    given to the seed (on 4x H200 two lanes' quick checks measured GPU0, another lane's)."""
    import os

    seen = {}
    monkeypatch.setattr(local, "preflight_failed", lambda log: seen.setdefault("cvd", os.environ.get("CUDA_VISIBLE_DEVICES")) and True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what submitit set for the job
    from mlrepro.util import proctree

    env = {"CUDA_VISIBLE_DEVICES": "2,3", proctree.MARKER: "test-marker"}
    assert local.run_and_time(str(tmp_path), env, str(tmp_path / "run.log"), str(tmp_path / "run.pid")) == local.PREFLIGHT_EXIT
    assert seen["cvd"] == "2,3"
