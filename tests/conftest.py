"""Shared fixtures: the local Slurm cluster, brought up once per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local cluster (`mlrepro cluster up` is idempotent, so a running one is reused).

    Outside CI a machine where it cannot be started (not root, no Slurm) skips;
    in CI (CI=true) that is a failure.
    """
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if os.geteuid() != 0 and shutil.which("sinfo") is None and not in_ci:
        pytest.skip("needs root (to start the local Slurm cluster) or a running one")
    proc = subprocess.run([sys.executable, "-m", "mlrepro", "cluster", "up"], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        message = f"mlrepro cluster up failed:\n{proc.stderr[-3000:]}"
        if in_ci or os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    # A CI machine's cluster kept from an earlier run (its state survives on disk) may still hold that
    # run's jobs, which would take this run's nodes. Elsewhere they may be another session's: left alone.
    if in_ci:
        from mlrepro.slurm import testcluster

        testcluster.cancel_all_jobs(testcluster.Layout(testcluster.state_dir_from_env()))
    return proc


@pytest.fixture(scope="session")
def mini_lora_data(tmp_path_factory) -> Path:
    """A workspace whose mini_lora data stages ran once for the whole session: the workflow tests that
    start from prepared data copy it (workspace.make_workspace(data_from=...)) instead of pretraining
    the base checkpoint again. The tests of the data stages themselves make their own."""
    from workspace import prepare_mini_lora_data

    return prepare_mini_lora_data(tmp_path_factory.mktemp("mini_lora_data") / "ws")


@pytest.fixture
def tree(tmp_path):
    """A copy of the repository's config/, schemas and the mini_lora implementation, to corrupt freely."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "config", tmp_path / "config")
    shutil.copytree(repo / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    shutil.copytree(repo / "implementations" / "mini_lora", tmp_path / "implementations" / "mini_lora")
    return tmp_path
