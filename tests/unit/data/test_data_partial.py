"""Issue 15 item 12: what an interrupted download leaves in `.<stage>.partial` must not reach
the stage's folder or its manifest, and the manifest names the final folder."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import yaml

from mlrepro import config
from mlrepro.stages import data as stages
from mlrepro.data import manifest
from mlrepro.util.fsutil import atomic_dir
import workspace

REPO = workspace.REPO

DOWNLOAD = textwrap.dedent("""\
    import pathlib, sys
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.npy").write_bytes(b"train" * 10)
    (out / "validation.npy").write_bytes(b"valid" * 4)
""")


@pytest.fixture
def tree(tmp_path):
    """A workflow root whose benchmark's dataset comes from the implementation's own script."""
    shutil.copytree(REPO / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    impl = tmp_path / "implementations" / "tiny"
    (impl / "scripts").mkdir(parents=True)
    (impl / "scripts" / "download_dataset.py").write_text(DOWNLOAD)
    (impl / "run_and_time.sh").write_text("#!/bin/bash\n")
    (impl / "config_CPU_1x1x4xtp1pp1cp1.sh").write_text(
        "export DGXNNODES=1 DGXNGPU=1 WALLTIME_RUNANDTIME=1 WALLTIME=2 MINIBS=4 TP=1 PP=1 CP=1\n")
    for sub in ("benchmarks", "systems"):
        (tmp_path / "config" / sub).mkdir(parents=True)
    (tmp_path / "config" / "benchmarks" / "tiny.yaml").write_text(yaml.safe_dump({
        "name": "tiny", "implementation": {"path": "implementations/tiny"}, "required_runs": 1,
        "target": {"metric": "eval_accuracy", "value": 0.9, "direction": "below"},
        "dataset": {"sources": [{"script": "scripts/download_dataset.py", "args": ["{out}"]}]}}))
    (tmp_path / "config" / "systems" / "here.yaml").write_text(yaml.safe_dump(
        {"name": "here", "scheduler": "local", "nodes": 1, "gpus_per_node": 1}))
    return tmp_path


def test_leftovers_of_an_interrupted_script_download_are_not_kept(tree, monkeypatch):
    monkeypatch.chdir(tree)
    settings = config.load({"benchmarks": ["tiny"], "system": "here"}, tree)
    resources = tree / "resources" / "tiny"
    partial = resources / ".data.partial"
    # what an earlier attempt killed mid-way left: a half-written file and a stray one
    (partial / "sub").mkdir(parents=True)
    (partial / "train.npy").write_bytes(b"half")
    (partial / "sub" / "stray.bin").write_bytes(b"x" * 100)
    (partial / "validation.npy.tmp").write_bytes(b"tmp")
    out = resources / "data" / "manifest.json"
    stages.dataset(settings, "tiny", out, tree / "logs" / "tiny" / "dataset.log")
    folder = resources / "data"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
        ".stage-manifest.json", "manifest.json", "train.npy", "validation.npy"]
    assert not partial.exists()
    manifest = json.loads(out.read_text())
    assert [f["path"] for f in manifest["files"]] == ["train.npy", "validation.npy"]
    assert manifest["root"] == str(folder.resolve())
    assert (folder / "train.npy").read_bytes() == b"train" * 10


def test_atomic_dir_empties_a_leftover_unless_resuming(tmp_path):
    target = tmp_path / "pkg"
    leftover = tmp_path / ".pkg.partial"
    leftover.mkdir()
    (leftover / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        assert list(tmp.iterdir()) == []
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    leftover.mkdir()
    (leftover / "resumed.bin").write_text("half")
    with atomic_dir(tmp_path / "pkg", resume=True) as tmp:
        assert (tmp / "resumed.bin").exists()


def test_only_self_checking_sources_resume_and_transfer_state_is_dropped(tmp_path):
    assert manifest.resumable([{"hub": {"repo_id": "a/b"}}, {"rclone": "remote:x"}])
    assert not manifest.resumable([{"hub": {"repo_id": "a/b"}}, {"script": "s.py"}])
    (tmp_path / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "download" / "w.incomplete").write_bytes(b"1")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "shard.bin.a1b2c3.partial").write_bytes(b"2")
    (tmp_path / "weights" / "shard0.bin").write_bytes(b"3")
    removed = manifest.drop_transfer_state(tmp_path)
    assert removed == [".cache/huggingface/", "weights/shard.bin.a1b2c3.partial"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["weights", "weights/shard0.bin"]


def test_finished_stage_rerun_after_a_kill_is_verified_not_fetched_again(tree, monkeypatch):
    """Issue 26 item 7: a workflow killed (or Ctrl-C'd) after a data stage finished leaves it marked
    incomplete; the rerun deletes its manifest and runs it again, which downloaded everything anew."""
    monkeypatch.chdir(tree)
    script = tree / "implementations" / "tiny" / "scripts" / "download_dataset.py"
    script.write_text(DOWNLOAD + "open(pathlib.Path(__file__).with_name('runs'), 'a').write('x')\n")
    runs = script.with_name("runs")
    settings = config.load({"benchmarks": ["tiny"], "system": "here"}, tree)
    folder = tree / "resources" / "tiny" / "data"
    out, log = folder / "manifest.json", tree / "logs" / "tiny" / "dataset.log"
    stages.dataset(settings, "tiny", out, log)
    first = out.read_bytes(), out.stat().st_mtime_ns
    train = (folder / "train.npy").stat()
    out.unlink()  # what Snakemake does to an incomplete job's output before running it again
    stages.dataset(settings, "tiny", out, log)
    assert runs.read_text() == "x", "the finished stage was downloaded again"
    assert (out.read_bytes(), out.stat().st_mtime_ns) == first  # nothing downstream looks newer
    assert (folder / "train.npy").stat().st_ino == train.st_ino
    # A file changed since: fetched again, not trusted.
    out.unlink()
    (folder / "train.npy").write_bytes(b"tampered" * 5 + b"xx")
    stages.dataset(settings, "tiny", out, log)
    assert runs.read_text() == "xx"
    assert (folder / "train.npy").read_bytes() == b"train" * 10
    # Other sources configured: fetched again.
    out.unlink()
    bench = tree / "config" / "benchmarks" / "tiny.yaml"
    data = yaml.safe_load(bench.read_text())
    data["dataset"]["sources"][0]["args"] = ["{out}", "--again"]
    bench.write_text(yaml.safe_dump(data))
    stages.dataset(config.load({"benchmarks": ["tiny"], "system": "here"}, tree), "tiny", out, log)
    assert runs.read_text() == "xxx"
