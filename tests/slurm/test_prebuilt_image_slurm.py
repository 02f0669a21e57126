"""A system that names a team's prebuilt image runs mini_lora on the local Slurm cluster with no build.

The image is made beforehand, as a team would have it: an enroot .sqsh file, and an image in a
podman store. The workflow checks it, records its digest and size, and hands it to run.sub as
CONT; nothing is built (the .sqsh case runs with a podman that fails if called). The cluster has no
pyxis (Debian packages none): tests/fixtures/pyxis_standin/srun plays its part, unpacking the
named image and running the image's own run_and_time.sh. The dataset and base checkpoint are
already in place, as on a cluster whose data is on a shared file system: made by an earlier run on
this machine and named as `user_path` sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from workspace import FIXTURES, make_workspace, podman_store, run_snakemake

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

STANDIN = FIXTURES / "pyxis_standin"
SLURM_ARGS = ("--profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "1")


def system(ws: Path, runtime: str, image: str) -> str:
    name = f"local-slurm-{runtime}-image"
    (ws / "config" / "systems" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "scheduler": "slurm", "nodes": 2, "gpus_per_node": 4, "partition": "debug", "account": None,
        "container_runtime": runtime, "container_images": {"mini_lora": image},
        "implementation_configs": {"mini_lora": "config_CPU_2x1x8xtp1pp1cp1.sh"},
        "slurm": {"status_command": "sacct", "poll_seconds": 2}}))
    return name


@pytest.fixture(scope="module")
def prepared(slurm_cluster, tmp_path_factory):
    """The dataset and base checkpoint, made once on this machine."""
    made = make_workspace(tmp_path_factory.mktemp("prebuilt") / "made")
    run_snakemake(made, "--profile", "profiles/local", "resources/mini_lora/data/manifest.json",
                  "resources/mini_lora/checkpoint/manifest.json", timeout=1800)
    return {"MINI_LORA_DATA": str(made / "resources" / "mini_lora" / "data"),
            "MINI_LORA_CHECKPOINT": str(made / "resources" / "mini_lora" / "checkpoint")}


def workspace_with_data_in_place(path: Path) -> Path:
    ws = make_workspace(path)
    config = ws / "config" / "benchmarks" / "mini_lora.yaml"
    bench = yaml.safe_load(config.read_text())
    bench["dataset"] = {"sources": [{"user_path": "MINI_LORA_DATA"}]}
    bench["checkpoint"] = {"sources": [{"user_path": "MINI_LORA_CHECKPOINT"}]}
    config.write_text(yaml.safe_dump(bench))
    return ws


def used(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def test_a_sqsh_file_is_used_as_named_and_nothing_is_built(prepared, tmp_path):
    ws = workspace_with_data_in_place(tmp_path / "ws")
    rootfs = tmp_path / "rootfs"
    shutil.copytree(ws / "implementations" / "mini_lora", rootfs / "workspace" / "ft-llm")
    sqsh = tmp_path / "images" / "mini_lora.sqsh"
    sqsh.parent.mkdir()
    subprocess.run(["mksquashfs", str(rootfs), str(sqsh), "-all-root", "-quiet", "-no-progress"], check=True)
    name = system(ws, "enroot", str(sqsh))
    # podman here only fails, and says so: a build would have to call it
    trap = tmp_path / "trap"
    trap.mkdir()
    (trap / "podman").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/podman-called\nexit 1\n")
    (trap / "podman").chmod(0o755)
    env = {**prepared, "PATH": f"{STANDIN}{os.pathsep}{trap}{os.pathsep}{os.environ['PATH']}",
           "PYXIS_STANDIN_LOG": str(tmp_path / "pyxis.jsonl")}
    target = "results/mini_lora/seed_1/run.json"

    plan = run_snakemake(ws, *SLURM_ARGS, target, "-n", "--config", f"system={name}", env=env)
    assert f"mini_lora container: image: {sqsh} (prebuilt, never built)" in plan.stdout
    assert f"    mini_lora seed 1 image: {sqsh} (prebuilt, never built)" in plan.stdout

    run_snakemake(ws, *SLURM_ARGS, target, "--config", f"system={name}", env=env, timeout=1800)
    record = json.loads((ws / "results" / "mini_lora" / "container.json").read_text())
    assert record["prebuilt"] is True and record["built"] is False and record["kind"] == "sqsh"
    assert record["digest"] == "sha256:" + hashlib.sha256(sqsh.read_bytes()).hexdigest()
    assert record["size"] == sqsh.stat().st_size and record["sqsh"]["path"] == str(sqsh)
    log = (ws / "logs" / "mini_lora" / "container.log").read_text()
    assert f"using the prebuilt image {sqsh} (sqsh, digest {record['digest']}" in log and "nothing is built" in log
    assert not (tmp_path / "podman-called").exists()
    assert {u["image"] for u in used(tmp_path / "pyxis.jsonl")} == {str(sqsh)}
    assert all(u["command"][0].endswith("/rootfs/workspace/ft-llm/run_and_time.sh") for u in used(tmp_path / "pyxis.jsonl"))
    run = json.loads((ws / "results" / "mini_lora" / "seed_1" / "run.json").read_text())
    assert run["status"] == "success" and run["converged"] is True


def test_a_local_podman_image_is_used_by_reference(prepared, tmp_path):
    if shutil.which("podman") is None:
        pytest.skip("apt-get install -y podman")
    ws = workspace_with_data_in_place(tmp_path / "ws")
    with podman_store(tmp_path / "store") as store:
        podman = store.cmd
        context = tmp_path / "context"
        shutil.copytree(ws / "implementations" / "mini_lora", context / "ft-llm")
        (context / "Dockerfile").write_text("FROM scratch\nCOPY ft-llm /workspace/ft-llm\n")
        subprocess.run([*podman, "build", "-t", "localhost/team/mini_lora:v1", str(context)], check=True,
                       capture_output=True)
        before = subprocess.run([*podman, "images", "-q", "--no-trunc"], capture_output=True, text=True).stdout.split()
        name = system(ws, "podman", "localhost/team/mini_lora:v1")
        env = {**prepared, **store.env, "PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}",
               "PYXIS_STANDIN_LOG": str(tmp_path / "pyxis.jsonl")}
        run_snakemake(ws, *SLURM_ARGS, "results/mini_lora/seed_1/run.json", "--config", f"system={name}", env=env,
                      timeout=1800)
        record = json.loads((ws / "results" / "mini_lora" / "container.json").read_text())
        image_id = subprocess.run([*podman, "image", "inspect", "--format", "{{.Id}}", "localhost/team/mini_lora:v1"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        assert record["kind"] == "podman" and record["image_id"] == f"sha256:{image_id}" and record["built"] is False
        assert record["tag"] == "localhost/team/mini_lora:v1" and record["size"] > 0
        log = (ws / "logs" / "mini_lora" / "container.log").read_text()
        assert "using the prebuilt image localhost/team/mini_lora:v1 (podman" in log
        after = subprocess.run([*podman, "images", "-q", "--no-trunc"], capture_output=True, text=True).stdout.split()
        assert after == before  # no image was built beside it
        assert {u["image"] for u in used(tmp_path / "pyxis.jsonl")} == {"localhost/team/mini_lora:v1"}
        run = json.loads((ws / "results" / "mini_lora" / "seed_1" / "run.json").read_text())
        assert run["status"] == "success" and run["converged"] is True
