"""Megatron-LM at a pinned commit from a local file:// repository (never the network)."""

from __future__ import annotations

import subprocess
import tarfile

import pytest

from mlrepro.implementation import fetch as implementation
from mlrepro.pretrain import megatron_source


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "Megatron-LM"
    (repo / "megatron" / "core").mkdir(parents=True)
    (repo / "megatron" / "core" / "__init__.py").write_text("")
    (repo / "docs").mkdir()
    (repo / "docs" / "big.md").write_text("not needed\n")
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "core only")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "pretrain_gpt.py").write_text("print('pretrain')\n")
    (repo / "gpt_builders.py").write_text("")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "gpt")
    return repo, _git(repo, "rev-parse", "HEAD"), old


def test_fetch_pinned_commit_and_pack(upstream, tmp_path):
    repo, commit, _ = upstream
    dest = megatron_source.fetch(f"file://{repo}", commit, tmp_path / "checkout")
    assert (dest / "pretrain_gpt.py").read_text() == "print('pretrain')\n"
    assert _git(dest, "rev-parse", "HEAD") == commit
    assert not (dest / "docs").exists()  # sparse: megatron/ and the top-level files only
    out = megatron_source.pack(dest, tmp_path / "megatron.tar.gz")
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
    assert {"megatron/core/__init__.py", "pretrain_gpt.py", "gpt_builders.py"} <= names
    assert "model_provider.py" not in names and not any(n.startswith("docs") for n in names)


def test_commit_without_pretrain_gpt_is_refused(upstream, tmp_path):
    repo, _, old = upstream
    with pytest.raises(implementation.FetchError, match="no pretrain_gpt.py"):
        megatron_source.fetch(f"file://{repo}", old, tmp_path / "old")
    with pytest.raises(implementation.FetchError, match="is not in|could not fetch"):
        megatron_source.fetch(f"file://{repo}", "0" * 40, tmp_path / "none")
