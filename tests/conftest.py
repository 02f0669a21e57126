"""Shared fixtures: the local Slurm cluster, brought up once per test session; and how the suite is
shared between pytest-xdist's workers (`make test` runs two)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


# The machine has one local Slurm cluster of two nodes: the tests that use it run on one worker, one
# at a time, so that none waits for nodes another test's jobs hold past the timeouts it was written
# with. The rest go by module, so that a module's fixtures are made once.
SLURM_GROUP = "local-slurm-cluster"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = SLURM_GROUP if "slurm_cluster" in item.fixturenames else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


def shared_tmp(tmp_path_factory, worker_id: str) -> Path:
    """A folder that every worker of this run sees (the workers' own temporary folders sit in it)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


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
def mini_lora_data(tmp_path_factory, worker_id) -> Path:
    """A workspace whose mini_lora data stages ran once for the whole run, by the first worker that
    asks (the others wait for it): the workflow tests that start from prepared data copy it
    (workspace.make_workspace(data_from=...)) instead of pretraining the base checkpoint again. The
    tests of the data stages themselves make their own."""
    from mlrepro.util.fsutil import locked
    from workspace import prepare_mini_lora_data

    root = shared_tmp(tmp_path_factory, worker_id)
    ws, done = root / "mini_lora_data" / "ws", root / "mini_lora_data.done"
    with locked(root / "mini_lora_data.lock"):
        if not done.exists():
            shutil.rmtree(ws.parent, ignore_errors=True)  # a worker that failed half-way
            prepare_mini_lora_data(ws)
            done.touch()
    return ws


@pytest.fixture
def tree(tmp_path):
    """A copy of the repository's config/, schemas and the mini_lora implementation, to corrupt freely."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "config", tmp_path / "config")
    shutil.copytree(repo / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    shutil.copytree(repo / "implementations" / "mini_lora", tmp_path / "implementations" / "mini_lora")
    return tmp_path
