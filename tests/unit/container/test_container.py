"""The container stage, for real with podman on a tiny FROM-scratch fixture image.

podman keeps its images for these tests in a throw-away store (vfs driver, its own
--root/--runroot), so they neither need overlay mounts nor touch the machine's images.
Containers are never started (podman run fails on these machines); they are only
built, created, exported and inspected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlrepro.container.image import (
    CONTEXT_LABEL,
    ContainerError,
    build_container,
    build_image,
    environment_manifest,
    export_sqsh,
    inspect_image,
    push,
)
from mlrepro.container.context import context_digest, context_files
import workspace

FIXTURE_IMAGE = workspace.FIXTURES / "fixture_image"
needs_podman = pytest.mark.skipif(shutil.which("podman") is None,
                                  reason="podman is not installed (apt-get install -y podman squashfs-tools)")
needs_squashfs = pytest.mark.skipif(shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
                                    reason="squashfs-tools is not installed (apt-get install -y squashfs-tools)")


@pytest.fixture
def context(tmp_path) -> Path:
    """A private copy of the fixture build context that a test may change."""
    copy = tmp_path / "context"
    shutil.copytree(FIXTURE_IMAGE, copy)
    return copy


@pytest.fixture(scope="module")
def podman_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("podman")
    with workspace.podman_store(store / "root") as podman, pytest.MonkeyPatch.context() as mp:
        for key, value in podman.env.items():
            mp.setenv(key, value)
        yield store


# --- build context digest (no podman needed) ----------------------------------------


def test_context_files_honour_dockerignore(context):
    (context / "scratch.tmp").write_text("x")
    (context / "payload" / "deep.tmp").write_text("x")  # `*.tmp` only matches at the top
    assert context_files(context, context / "Dockerfile") == [
        ".dockerignore", "Dockerfile", "payload/data.txt", "payload/deep.tmp", "payload/hello.sh",
    ]


def test_context_digest_changes_only_with_what_the_build_sees(context):
    dockerfile = context / "Dockerfile"
    first = context_digest(context, dockerfile)
    assert first.startswith("sha256:") and len(first) == 7 + 64
    assert context_digest(context, dockerfile) == first

    (context / "notes" / "README.txt").write_text("edited notes\n")
    (context / "scratch.tmp").write_text("ignored\n")
    assert context_digest(context, dockerfile) == first

    (context / "payload" / "data.txt").write_text("changed data\n")
    second = context_digest(context, dockerfile)
    assert second != first

    (context / "payload" / "data.txt").chmod(0o755)
    third = context_digest(context, dockerfile)
    assert third != second

    dockerfile.write_text(dockerfile.read_text() + "ENV EXTRA=1\n")
    assert context_digest(context, dockerfile) != third


def test_dockerignore_exceptions_and_double_star(context):
    (context / ".dockerignore").write_text("**/*.txt\n!payload/data.txt\n")
    files = context_files(context)
    assert "payload/data.txt" in files
    assert "notes/README.txt" not in files


def test_context_digest_errors(tmp_path):
    with pytest.raises(ContainerError, match="not a folder"):
        context_digest(tmp_path / "absent")
    with pytest.raises(ContainerError, match="Dockerfile not found"):
        context_digest(tmp_path, tmp_path / "Dockerfile")


# --- runtime: none ---------------------------------------------------------------------


def test_runtime_none_records_the_python_environment(tmp_path):
    out = tmp_path / "container.json"
    record = build_container({"runtime": "none"}, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    env = record["environment"]
    assert record["runtime"] == "none"
    assert env["python"].count(".") == 2
    assert env["packages"]["torch"] and env["packages"]["mlperf-logging"]
    assert env["packages"]["snakemake"] and env["packages"]["peft"] and env["packages"]["transformers"]
    assert isinstance(env["cuda"]["available"], bool)
    assert env["hostname"]


def test_environment_manifest_matches_this_interpreter():
    import platform

    import torch

    env = environment_manifest()
    assert env["python"] == platform.python_version()
    assert env["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["cuda"]["available"] == torch.cuda.is_available()


def test_unknown_runtime_is_rejected(tmp_path):
    with pytest.raises(ContainerError, match="unknown container runtime 'singularity'"):
        build_container({"runtime": "singularity"}, tmp_path / "c.json")
    with pytest.raises(ContainerError, match="needs `context`"):
        build_container({"runtime": "podman", "tag": "x"}, tmp_path / "c.json")


# --- podman ------------------------------------------------------------------------------


@needs_podman
def test_build_image_records_id_digest_and_context(podman_store, context):
    record = build_image(context, None, "localhost/mlrepro-fixture:build")
    info = inspect_image("localhost/mlrepro-fixture:build")
    assert record["image_id"] == "sha256:" + info["Id"]
    assert record["digest"].startswith("sha256:")
    assert record["context_digest"] == context_digest(context, context / "Dockerfile")
    assert info["Config"]["Labels"][CONTEXT_LABEL] == record["context_digest"]
    assert "FIXTURE_GREETING=hello" in info["Config"]["Env"]


@needs_podman
def test_build_failure_shows_podmans_reason(podman_store, context):
    (context / "Dockerfile").write_text("FROM scratch\nCOPY missing-file /x\n")
    with pytest.raises(ContainerError) as err:
        build_image(context, None, "localhost/mlrepro-fixture:broken")
    assert "building localhost/mlrepro-fixture:broken with podman failed" in str(err.value)
    assert "missing-file" in str(err.value)


def _unsquash(sqsh: Path, dest: Path) -> Path:
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(dest), str(sqsh)], check=True, capture_output=True)
    return dest


@needs_podman
@needs_squashfs
def test_export_sqsh_has_the_enroot_layout(podman_store, context, tmp_path):
    build_image(context, None, "localhost/mlrepro-fixture:sqsh")
    out = tmp_path / "images" / "fixture.sqsh"
    record = export_sqsh("localhost/mlrepro-fixture:sqsh", out)
    assert out.read_bytes()[:4] == b"hsqs"
    assert record["size"] == out.stat().st_size and len(record["sha256"]) == 64
    assert sorted(p.name for p in out.parent.iterdir()) == ["fixture.sqsh"]  # no staging left

    listing = subprocess.run(["unsquashfs", "-lln", str(out)], check=True, capture_output=True, text=True).stdout
    owners = {line.split()[1] for line in listing.splitlines() if line.startswith(("-", "d"))}
    assert owners == {"0/0"}  # -all-root, as enroot makes them

    root = _unsquash(out, tmp_path / "unpacked")
    assert (root / "opt/fixture/data.txt").read_text() == "a small data file\n"
    assert os.access(root / "opt/fixture/hello.sh", os.X_OK)
    assert not (root / "notes").exists()
    assert "FIXTURE_GREETING=hello" in (root / "etc/environment").read_text().splitlines()
    rc = (root / "etc/rc").read_text()
    assert "cd /workspace" in rc
    assert "exec /opt/fixture/hello.sh --name fixture" in rc
    assert 'exec "$@"' in rc
    assert "# org.mlrepro.fixture true" in rc
    assert (root / "etc/fstab").read_text() == ""
    assert (root / "workspace").is_dir()
    # /etc/rc is valid shell
    subprocess.run(["bash", "-n", str(root / "etc/rc")], check=True)


@needs_podman
def test_export_of_a_missing_image_is_a_clear_error(podman_store, tmp_path):
    with pytest.raises(ContainerError, match="no image 'localhost/absent:1'"):
        export_sqsh("localhost/absent:1", tmp_path / "x.sqsh")
    assert not (tmp_path / "x.sqsh").exists()


@needs_podman
def test_push_to_an_oci_archive(podman_store, context, tmp_path):
    build_image(context, None, "localhost/mlrepro-fixture:push")
    archive = tmp_path / "fixture.tar"
    record = push("localhost/mlrepro-fixture:push", f"oci-archive:{archive}")
    assert record["ref"] == f"oci-archive:{archive}"
    assert record["digest"].startswith("sha256:")
    assert archive.stat().st_size > 0


@needs_podman
@needs_squashfs
def test_build_container_rebuilds_only_when_the_context_changes(podman_store, context, tmp_path):
    out = tmp_path / "results" / "container.json"
    sqsh = tmp_path / "results" / "fixture.sqsh"
    spec = {"runtime": "podman", "context": str(context), "tag": "localhost/mlrepro-fixture:stage",
            "sqsh": str(sqsh)}
    first = build_container(spec, out)
    assert json.loads(out.read_text()) == first
    assert first["context_digest"] == context_digest(context, context / "Dockerfile")
    assert first["sqsh"]["sha256"] and sqsh.is_file()
    sqsh_inode = sqsh.stat().st_ino

    # Ignored edits: same image, same squashfs file.
    (context / "notes" / "README.txt").write_text("more notes\n")
    again = build_container(spec, out)
    assert again["image_id"] == first["image_id"]
    assert again["created"] == first["created"]
    assert sqsh.stat().st_ino == sqsh_inode

    # A lost record is recovered from the image label without rebuilding.
    out.unlink()
    recovered = build_container(spec, out)
    assert recovered["image_id"] == first["image_id"]

    # A change the build sees: new image, new squashfs.
    (context / "payload" / "data.txt").write_text("new data\n")
    changed = build_container(spec, out)
    assert changed["image_id"] != first["image_id"]
    assert changed["context_digest"] != first["context_digest"]
    assert changed["sqsh"]["sha256"] != first["sqsh"]["sha256"]
    assert (_unsquash(sqsh, tmp_path / "u") / "opt/fixture/data.txt").read_text() == "new data\n"
