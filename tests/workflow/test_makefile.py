"""Issue 8, point 1: README's commands with the distribution's own python3 (PEP 668).

A copy of the checkout gets its .venv/ from `make` with PY set to a PEP 668 python3; so
that the test takes seconds, not the minutes of downloading torch, the new venv sees the
packages of the environment running the tests through a .pth file, and pip installs only
mlrepro itself (its requirements are already satisfied).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from workspace import REPO

pytestmark = pytest.mark.slow


def pep668_python() -> str:
    """A python3 that refuses `pip install` into itself: the distribution's own."""
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if not candidate or not os.path.exists(candidate):
            continue
        stdlib = subprocess.run([candidate, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                capture_output=True, text=True, timeout=60).stdout.strip()
        if stdlib and Path(stdlib, "EXTERNALLY-MANAGED").is_file():
            return candidate
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI runs on Debian, whose python3 is marked EXTERNALLY-MANAGED (PEP 668); none found")
    pytest.skip("no PEP 668 (EXTERNALLY-MANAGED) python3 on this machine")


def checkout_copy(dest: Path) -> Path:
    """The files a clone has: tracked plus untracked-but-not-ignored (no .venv, no results)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for rel in filter(None, listed.stdout.split("\0")):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def make(clone: Path, *args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


def test_make_uses_a_project_venv_made_from_the_distributions_python(tmp_path):
    python = pep668_python()
    clone = checkout_copy(tmp_path / "clone")
    # Only the PATH a fresh login has: nothing of the environment running this test.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT"):
        if name in os.environ:
            env[name] = os.environ[name]

    # What the old Makefile did fails there, which is the point of the venv.
    refused = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-deps", str(clone)],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stdout + refused.stderr

    plan = make(clone, "-n", "mini", f"PY={python}", env=env)
    assert plan.returncode == 0, plan.stderr
    assert f"{python} -m venv .venv" in plan.stdout
    assert ".venv/bin/python -m pip install" in plan.stdout and f"{python} -m pip" not in plan.stdout
    assert ".venv/bin/python -m snakemake --profile profiles/local" in plan.stdout
    assert "break-system-packages" not in plan.stdout

    made = make(clone, "venv", f"PY={python}", env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    venv_python = clone / ".venv" / "bin" / "python"
    site = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    Path(site, "mlrepro-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    installed = make(clone, "install", f"PY={python}", env=env, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run([str(venv_python), "-c", "import mlrepro; print(mlrepro.__file__)"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert Path(where.stdout.strip()).is_relative_to(clone / "src"), where
    for name in ("local", "slurm"):
        assert (tmp_path / "xdg" / "snakemake" / name).resolve() == clone / "profiles" / name
    # Safe to repeat: up to date, nothing reinstalled.
    again = make(clone, "-n", "install", f"PY={python}", env=env)
    assert "pip install" not in again.stdout and "-m venv" not in again.stdout

    # A stage that runs a host script (numpy: only in the venv) works without activating the
    # venv, as `make mini` runs it: the stage puts its own interpreter first on PATH.
    proc = subprocess.run([str(venv_python), "-m", "snakemake", "--profile", "profiles/local",
                           "resources/mini_lora/data/manifest.json"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (clone / "resources" / "mini_lora" / "data" / "manifest.json").is_file()


def test_ci_runs_readme_commands_with_the_distributions_python():
    text = (REPO / ".ci" / "run").read_text()
    assert "make lint test PY=/usr/bin/python3" in text
    assert "\nmake test\n" not in text
