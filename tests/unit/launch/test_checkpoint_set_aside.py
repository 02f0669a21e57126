"""A bad last checkpoint is found, set aside and named, and the previous good one is what a resume reads."""

from __future__ import annotations

import json

from mlrepro.formats import checkpoints


def ours(folder, step, payload=b"x" * 100, files=None):
    path = folder / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(payload)
    meta = {"step": step, "val_loss": 3.0}
    if files is not False:
        meta["files"] = files or {"state.pt": len(payload)}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_a_truncated_file_is_a_problem_and_an_intact_one_is_not(tmp_path):
    ours(tmp_path, 40)
    good = checkpoints.latest(tmp_path)
    assert checkpoints.problems(good) == []
    (good.path / "state.pt").write_bytes(b"x" * 10)
    assert checkpoints.problems(good) == [f"{good.path / 'state.pt'}: 10 bytes, 100 written"]
    (good.path / "state.pt").unlink()
    assert checkpoints.problems(good) == [f"{good.path / 'state.pt'}: missing"]


def test_a_checkpoint_without_a_file_list_is_taken_as_it_is(tmp_path):
    ours(tmp_path, 40, files=False)
    assert checkpoints.problems(checkpoints.latest(tmp_path)) == []


def test_set_aside_makes_the_previous_checkpoint_the_latest(tmp_path):
    ours(tmp_path, 40)
    ours(tmp_path, 80)
    aside = checkpoints.set_aside(tmp_path, 80)
    assert aside == tmp_path / "bad_step_00000080" and aside.is_dir()
    assert checkpoints.latest_step(tmp_path) == 40
    assert checkpoints.set_aside(tmp_path, 80) is None  # nothing left of that step: never loops


def test_megatron_set_aside_rewrites_the_tracker(tmp_path):
    for it in (100, 200):
        (tmp_path / f"iter_{it:07d}" / "mp_rank_00").mkdir(parents=True)
    (tmp_path / checkpoints.MEGATRON_TRACKER).write_text("200")
    assert checkpoints.latest_step(tmp_path) == 200
    assert checkpoints.set_aside(tmp_path, 200) == tmp_path / "bad_iter_0000200"
    assert (tmp_path / checkpoints.MEGATRON_TRACKER).read_text().strip() == "100"
    assert checkpoints.latest_step(tmp_path) == 100
    checkpoints.set_aside(tmp_path, 100)
    assert not (tmp_path / checkpoints.MEGATRON_TRACKER).exists()  # none left: the run starts over
    assert checkpoints.latest_step(tmp_path) == 0
