"""Config validation: every error names the file and the key, defaults are filled."""

import shutil
from pathlib import Path

import pytest
import yaml

from mlrepro import config
import workspace

REPO = workspace.REPO




def edit(path: Path, **changes):
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))


def base_config():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_repository_config_is_valid():
    for benchmark in ("llama2_lora", "llama31_405b"):  # git implementations: not fetched, still valid
        for system in ("local", "local-slurm", "dgxb200", "gb200-nvl72"):
            config.load({**base_config(), "benchmarks": [benchmark], "system": system}, REPO)
    settings = config.load(base_config(), REPO)
    mini = settings.benchmark("mini_lora")
    assert mini.seeds == tuple(range(1, 11))
    assert mini.retries == 1 and mini.not_converged == "count"
    assert settings.system.scheduler == "local"
    assert mini.implementation_dir == REPO / "implementations" / "mini_lora"


def test_misspelled_benchmark_key_is_named(tree):
    bench = tree / "config" / "benchmarks" / "mini_lora.yaml"
    edit(bench, requird_runs=3)
    with pytest.raises(config.ConfigError) as err:
        config.load(base_config(), tree)
    msg = str(err.value)
    assert "config/benchmarks/mini_lora.yaml" in msg and "'requird_runs'" in msg


def test_negative_run_count_is_named(tree):
    edit(tree / "config" / "benchmarks" / "mini_lora.yaml", required_runs=-1)
    with pytest.raises(config.ConfigError, match=r"mini_lora.yaml[\s\S]*required_runs: -1 is less than the minimum of 1"):
        config.load(base_config(), tree)


def test_missing_implementation_folder_is_named(tree):
    shutil.rmtree(tree / "implementations" / "mini_lora")
    with pytest.raises(config.ConfigError, match=r"implementation.path: folder 'implementations/mini_lora' does not exist"):
        config.load(base_config(), tree)


def test_misspelled_top_level_key_and_unknown_system():
    with pytest.raises(config.ConfigError, match=r"unknown key 'sytem'"):
        config.load({**base_config(), "sytem": "local"}, REPO)
    with pytest.raises(config.ConfigError, match=r"system 'nowhere'.*not found.*known systems: .*local"):
        config.load({**base_config(), "system": "nowhere"}, REPO)


def test_nested_key_path_is_named(tree):
    edit(tree / "config" / "benchmarks" / "mini_lora.yaml", target={"metric": "eval_accuracy", "value": 1, "direction": "down"})
    with pytest.raises(config.ConfigError, match=r"target.direction: 'down' is not one of"):
        config.load(base_config(), tree)


def test_system_override_from_command_line():
    settings = config.load({**base_config(), "partition": "batch"}, REPO)
    assert settings.system.partition == "batch"


def test_numbers_of_a_command_line_mapping_are_numbers():
    """--config pretrain='{train_iters: 300, ...}' reaches us as strings (Snakemake's YAML BaseLoader)."""
    given = {"train_iters": "300", "gbs": "16", "attention": "sdpa", "megatron": "/opt/megatron.tar.gz"}
    settings = config.load({**base_config(), "pretrain": given}, REPO)
    assert settings.pretrain_overrides == {"train_iters": 300, "gbs": 16, "attention": "sdpa",
                                           "megatron": "/opt/megatron.tar.gz"}
    with pytest.raises(config.ConfigError, match=r"pretrain.train_iters: 'lots' is not of type 'integer'"):
        config.load({**base_config(), "pretrain": {"train_iters": "lots"}}, REPO)
    with pytest.raises(config.ConfigError, match=r"pretrain.gbs: 1.5 is not of type 'integer'"):
        config.load({**base_config(), "pretrain": {"gbs": 1.5}}, REPO)


def test_fewer_seeds_than_runs_rejected(tree):
    edit(tree / "config" / "benchmarks" / "mini_lora.yaml", seeds=[1, 2])
    with pytest.raises(config.ConfigError, match="2 seeds given but required_runs is 10"):
        config.load(base_config(), tree)


def test_invalid_yaml_is_reported(tree):
    (tree / "config" / "systems" / "local.yaml").write_text("name: [unclosed\n")
    with pytest.raises(config.ConfigError, match="local.yaml: not valid YAML"):
        config.load(base_config(), tree)
