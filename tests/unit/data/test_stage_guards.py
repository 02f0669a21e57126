"""Issue 8, points 5 and 6: what a download stage checks before it starts, and how a token
reaches a script that runs in the container.

`podman run` cannot start a container on these machines (crun cannot set rlimits here), so
the image is built by the real podman and `podman run` goes to a shim on PATH that records
the command line and the environment it was given (outside the workspace), then writes a file
into the mounted output folder as the download script would. enroot is not installed here:
its command line goes to a shim in the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from mlrepro import config
from mlrepro.stages import data as stages
from mlrepro.data import checks, pipeline
from workspace import REPO, make_workspace, podman_store, run_snakemake

TOKEN = "hf_guard_test_TOKEN_5f0c1e9a7b3d"
BENCH = "gated"

SHIM = '''#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
at = 0
while at < len(args) and args[at].startswith("--"):  # global options (the store's), each with a value
    at += 2
if args[at:at + 1] != [{verb!r}]:
    os.execv({real!r}, [{real!r}, *args])
Path({record!r}).write_text(json.dumps({{"argv": args, "env": dict(os.environ)}}))
mounts = [a for i, a in enumerate(args) if i and args[i - 1] in ("--volume", "--mount")]
Path(mounts[0].split(":")[0], "weights.bin").write_bytes(b"w" * 1000)
print("HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set")
'''


def install_shim(folder: Path, name: str, verb: str, record: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    real = shutil.which(name) or f"/usr/bin/{name}"
    shim = folder / name
    shim.write_text(SHIM.format(python=sys.executable, verb=verb, real=real, record=str(record)))
    shim.chmod(0o755)
    return shim


def add_gated_benchmark(ws: Path) -> None:
    """A benchmark whose checkpoint source needs HF_TOKEN, as llama2_lora's does."""
    impl = ws / "implementations" / BENCH
    impl.mkdir()
    for name in ("config_common.sh", "config_CPU_1x2x8xtp1pp1cp1.sh", "run.sub", "run_and_time.sh"):
        shutil.copy2(ws / "implementations" / "mini_lora" / name, impl / name)
    (impl / "scripts").mkdir()
    (impl / "scripts" / "download_model.py").write_text("raise SystemExit('runs in the container only')\n")
    # The dataset's script must exist for the benchmark to load (mlrepro.config); this test never runs it.
    (impl / "scripts" / "download_dataset.py").write_text("raise SystemExit('not run by this test')\n")
    (impl / "Dockerfile").write_text("FROM scratch\nCOPY . /workspace/ft-llm\nWORKDIR /workspace/ft-llm\n")
    bench = yaml.safe_load((ws / "config" / "benchmarks" / "mini_lora.yaml").read_text())
    bench.update(name=BENCH, implementation={"path": f"implementations/{BENCH}"})
    bench["checkpoint"] = {"needs_token": True,
                           "sources": [{"script": "scripts/download_model.py", "args": ["--model_dir", "{out}"]}]}
    (ws / "config" / "benchmarks" / f"{BENCH}.yaml").write_text(yaml.safe_dump(bench))
    system = yaml.safe_load((ws / "config" / "systems" / "local.yaml").read_text())
    system.update(name="local-podman", container_runtime="podman", implementation_configs={})
    (ws / "config" / "systems" / "local-podman.yaml").write_text(yaml.safe_dump(system))


def files_holding(folders: list[Path], secret: str) -> list[Path]:
    return [p for folder in folders if folder.exists() for p in folder.rglob("*")
            if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_token_reaches_the_container_by_name_and_no_file(tmp_path, monkeypatch):
    if shutil.which("podman") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("podman is not installed, and CI installs it")
        pytest.skip("podman is not installed")
    ws = make_workspace(tmp_path / "ws")
    add_gated_benchmark(ws)
    record = tmp_path / "podman-run.json"
    install_shim(tmp_path / "bin", "podman", "run", record)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    target = f"resources/{BENCH}/checkpoint/manifest.json"
    args = ("--profile", "profiles/local", target, "--config", "system=local-podman")
    with podman_store(tmp_path / "podman-root") as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        missing = run_snakemake(ws, *args, check=False, timeout=600)
        assert missing.returncode != 0
        assert "environment variable HF_TOKEN is not set" in missing.stdout + missing.stderr
        assert not record.exists(), "a container started without the token"

        monkeypatch.setenv("HF_TOKEN", TOKEN)
        run_snakemake(ws, *args, timeout=600)
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert ["--env", "HF_TOKEN"] in [argv[i:i + 2] for i in range(len(argv) - 1)], argv
    assert seen["env"]["HF_TOKEN"] == TOKEN, "the runtime was not given the token to pass in"
    assert not any(TOKEN in a for a in argv), "the token is on the command line"
    # in the store the container stage built the image in
    assert argv[argv.index("--root") + 1] == store.env["MLREPRO_PODMAN_ROOT"], argv
    assert (ws / "resources" / BENCH / "checkpoint" / "weights.bin").is_file()
    assert "HF_TOKEN is set" in (ws / "logs" / BENCH / "checkpoint.log").read_text()
    leaked = files_holding([ws / d for d in ("results", "resources", "logs", ".snakemake")], TOKEN)
    assert leaked == [], f"the token's value was written to {leaked}"


def test_enroot_gets_the_token_by_name(tmp_path, monkeypatch):
    """The .sqsh path (pyxis clusters): `enroot start --env HF_TOKEN`, the value only in its environment."""
    record = tmp_path / "enroot-start.json"
    install_shim(tmp_path / "bin", "enroot", "start", record)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "out"
    out.mkdir()
    pipeline._run_script({"script": "scripts/download_model.py", "args": ["--model_dir", "{out}"]}, tmp_path, out,
                       str(tmp_path / "image.sqsh"), tmp_path / "logs" / "checkpoint.log",
                       {"HF_TOKEN": TOKEN, "OTHER": "1"})
    seen = json.loads(record.read_text())
    assert ["--env", "HF_TOKEN"] in [seen["argv"][i:i + 2] for i in range(len(seen["argv"]) - 1)]
    assert seen["env"]["HF_TOKEN"] == TOKEN and not any(TOKEN in a for a in seen["argv"])
    assert files_holding([tmp_path / "logs", out], TOKEN) == []


# ---------------------------------------------------------------- disk: NVIDIA's figures


def bench_of(name: str) -> config.Benchmark:
    return config.load_benchmark(REPO, name)


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_llama2_lora_needs_300_gb_for_data_and_checkpoint_together(tmp_path):
    bench = bench_of("llama2_lora")
    for stage in ("dataset", "checkpoint"):
        needed, why = pipeline.space_needed(tmp_path, bench, stage)
        assert needed == 300 * 10**9 and "300 GB for its dataset and checkpoint together" in why
    # What is already downloaded (a finished dataset, a partial checkpoint) counts as had.
    sparse(tmp_path / "resources" / "llama2_lora" / "data" / "train.npy", 2 * 10**9)
    sparse(tmp_path / "resources" / "llama2_lora" / ".checkpoint.partial" / "weights" / "a", 100 * 10**9)
    assert pipeline.space_needed(tmp_path, bench, "checkpoint")[0] == 198 * 10**9


def test_llama31_405b_needs_2_5_tb_and_its_checkpoint_1_5_tb(tmp_path):
    bench = bench_of("llama31_405b")
    assert bench.min_free_gb == 2500 and bench.checkpoint["min_free_gb"] == 1500
    needed, why = pipeline.space_needed(tmp_path, bench, "dataset")
    # The checkpoint is used in place (LOAD_CHECKPOINTS_PATH): its 1.5 TB are not written here.
    assert needed == 1000 * 10**9 and "2500 GB" in why and "1500 GB of it used in place" in why
    assert pipeline.space_needed(tmp_path, bench, "checkpoint")[0] == 0
    copied = config.Benchmark(**{**bench.__dict__, "checkpoint": {**bench.checkpoint, "sources": [
        {"rclone": "remote:405b", "into": "405b"}]}})
    assert pipeline.space_needed(tmp_path, copied, "checkpoint")[0] == 2500 * 10**9
    assert pipeline.space_needed(tmp_path, copied, "dataset")[0] == 2500 * 10**9


def test_the_stage_says_how_much_is_free_and_needed(tmp_path, monkeypatch):
    """Through the dataset stage of the real llama2_lora config, on a filesystem with 12.3 GB free."""
    ws = make_workspace(tmp_path / "ws")
    impl = ws / "resources" / "llama2_lora" / "implementation" / "NVIDIA" / "benchmarks" / "llama2_70b_lora" / \
        "implementations" / "nyx_n1_ngc25.04_nemo"
    shutil.copytree(REPO / "tests" / "fixtures" / "nvidia_configs" / "llama2_70b_lora" / "nyx_n1_ngc25.04_nemo", impl)
    (ws / "resources" / "llama2_lora" / "implementation.json").write_text("{}")
    settings = config.load({"benchmarks": ["llama2_lora"], "system": "dgxb200"}, ws)
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 12_300_000_000,
                                                                                         12_300_000_000))
    out = ws / "resources" / "llama2_lora" / "data" / "manifest.json"
    with pytest.raises(checks.DataError) as info:
        stages.dataset(settings, "llama2_lora", out, ws / "logs" / "dataset.log")
    message = str(info.value)
    assert "need 300.0 GB, only 12.3 GB free" in message, message
    assert "llama2_lora needs 300 GB for its dataset and checkpoint together" in message
    assert not out.parent.exists(), "the stage started before its disk check"
