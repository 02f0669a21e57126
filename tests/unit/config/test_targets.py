"""Issue 8, point 2: any config/benchmarks/<b>.yaml is a file target of the named profiles,
and a system that cannot run the benchmark is refused with the systems that can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlrepro import config, profiles
from mlrepro.kinds import systems
from workspace import REPO, make_workspace, planned_jobs

BENCHMARKS = config.benchmark_names(REPO)


def settings_for(root: Path, system: str, benchmarks=("mini_lora",)) -> config.Settings:
    return config.load({"benchmarks": list(benchmarks), "system": system}, root)


# ---------------------------------------------------------------- unit: which systems fit


def test_unlisted_benchmark_is_loaded_when_asked_for():
    settings = settings_for(REPO, "dgxb200")
    assert list(settings.benchmarks) == ["mini_lora"]
    assert settings.benchmark("llama2_lora").required_runs == 10
    with pytest.raises(config.ConfigError, match=r"config/benchmarks/nope\.yaml not found .*llama2_lora"):
        settings.benchmark("nope")


def test_unlisted_benchmark_is_validated_by_its_schema(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    path = ws / "config" / "benchmarks" / "llama2_lora.yaml"
    data = yaml.safe_load(path.read_text())
    data["requires"]["gpus"] = 0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(config.ConfigError, match=r"config/benchmarks/llama2_lora\.yaml is invalid:\n  - requires\.gpus"):
        settings_for(ws, "local").benchmark("llama2_lora")


def test_llama2_lora_on_the_cpu_only_local_system_names_the_systems_that_fit():
    with pytest.raises(config.ConfigError) as info:
        systems.check(settings_for(REPO, "local"), "llama2_lora")
    message = str(info.value)
    assert message.startswith("llama2_lora cannot run on system 'local' (config/systems/local.yaml): ")
    assert "container runtime enroot (local has none)" in message
    assert "at least 8 GPUs (local has none, CPU only)" in message
    fits = message.split("Systems that fit: ")[1]
    assert "--config system=dgxb200" in fits and "--config system=gb200-nvl72" in fits
    assert "local-slurm" not in fits and "system=local," not in fits + ","


def test_systems_that_fit_each_benchmark():
    def fits_of(bench):
        return systems.fitting_systems(REPO, bench, with_implementation=systems.implementation_known(REPO, bench))

    fits = {name: fits_of(config.load_benchmark(REPO, name)) for name in BENCHMARKS}
    assert set(fits["mini_lora"]) == {"local", "local-slow", "local-slurm", "device-h100x2", "device-h200x2"}
    assert "dgxb200" in fits["llama2_lora"] and "local-slurm" not in fits["llama2_lora"]
    # NVIDIA's smallest llama31_405b submission takes 256 GPUs: one NVL72 rack is not enough.
    assert "gb200-nvl72x4" in fits["llama31_405b"] and "gb200-nvl72" not in fits["llama31_405b"]
    assert all(fits.values()), f"a benchmark no example system can run: {fits}"


def test_mini_lora_fits_the_default_system():
    assert systems.check(settings_for(REPO, "local"), "mini_lora").name == "mini_lora"


# ---------------------------------------------------------------- unit: named profiles


def test_profiles_install_links_and_is_idempotent(tmp_path):
    dest = tmp_path / "xdg" / "snakemake"
    first = profiles.install(REPO, dest)
    for name in profiles.NAMES:
        assert (dest / name).is_symlink() and (dest / name).resolve() == REPO / "profiles" / name
    again = profiles.install(REPO, dest)
    assert [line for _, line in again] != [line for _, line in first]
    assert all("already installed" in line for _, line in again)


def test_profiles_install_never_replaces_a_users_own_profile(tmp_path):
    dest = tmp_path / "snakemake"
    own = dest / "slurm"
    own.mkdir(parents=True)
    (own / "config.yaml").write_text("executor: slurm\njobs: 3\n")
    elsewhere = tmp_path / "my-local-profile"
    elsewhere.mkdir()
    (dest / "local").symlink_to(elsewhere)
    done = dict(profiles.install(REPO, dest))
    assert (own / "config.yaml").read_text() == "executor: slurm\njobs: 3\n" and not own.is_symlink()
    assert "your own profile; left as is" in done["slurm"]
    assert (dest / "local").resolve() == elsewhere and "your own link" in done["local"]
    # --force re-points only links of ours, never a user's own.
    done = dict(profiles.install(REPO, dest, force=True))
    assert not own.is_symlink() and (dest / "local").resolve() == elsewhere


def test_profiles_install_replaces_a_dangling_link_of_ours(tmp_path):
    dest = tmp_path / "snakemake"
    dest.mkdir()
    gone = tmp_path / "deleted-clone" / "profiles" / "slurm"
    (dest / "slurm").symlink_to(gone)
    other = tmp_path / "other-clone" / "profiles" / "local"
    other.mkdir(parents=True)
    (dest / "local").symlink_to(other)
    done = dict(profiles.install(REPO, dest))
    assert (dest / "slurm").resolve() == REPO / "profiles" / "slurm"
    assert (dest / "local").resolve() == other and "another checkout" in done["local"]
    profiles.install(REPO, dest, force=True)
    assert (dest / "local").resolve() == REPO / "profiles" / "local"


# ---------------------------------------------------------------- the real snakemake, named profiles


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A checkout after set-up: the named profiles installed (in a private XDG_CONFIG_HOME)."""
    root = tmp_path_factory.mktemp("named")
    ws = make_workspace(root / "ws")
    env = {**os.environ, "XDG_CONFIG_HOME": str(root / "xdg"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "mlrepro", "profiles", "install"], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return ws, env


def snakemake(installed, *args):
    ws, env = installed
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_named_profile_plans_every_benchmark(installed, benchmark):
    """`snakemake --profile slurm results/<b>/score.json -n` for every config/benchmarks/<b>.yaml,
    listed under `benchmarks:` or not, on a system that fits it."""
    ws, _ = installed
    bench = config.load_benchmark(ws, benchmark)
    system = systems.fitting_systems(ws, bench, with_implementation=systems.implementation_known(ws, bench))[-1]
    proc = snakemake(installed, "--profile", "slurm", f"results/{benchmark}/score.json", "-n",
                     "--config", f"system={system}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    jobs = planned_jobs(output)
    assert jobs.get("train_seed") == len(bench.seeds) and jobs.get("score") == 1, output[-3000:]
    assert not (ws / "results").exists()


@pytest.mark.slow
def test_card_command_on_dgxb200_and_on_the_default_system(installed):
    """The acceptance: a plan of 10 seeds with --config system=dgxb200; without it, one message."""
    ws, _ = installed
    proc = snakemake(installed, "--profile", "slurm", "results/llama2_lora/score.json", "-n",
                     "--config", "system=dgxb200")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert planned_jobs(proc.stdout + proc.stderr).get("train_seed") == 10

    proc = snakemake(installed, "--profile", "slurm", "results/llama2_lora/score.json", "-n")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert output.count("cannot run on system") == 1, output[-3000:]
    assert "llama2_lora cannot run on system 'local'" in output
    assert "Systems that fit: --config system=dgxb200" in output
    assert "train_seed" not in planned_jobs(output) and not (ws / "results").exists()
