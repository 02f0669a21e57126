"""Config mistakes of issue 15 (item 10): each stops before any job, naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlrepro import config
from workspace import make_workspace, run_snakemake
import workspace

REPO = workspace.REPO
BENCH = Path("config") / "benchmarks" / "mini_lora.yaml"




def base_config():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def edit(path: Path, **changes):
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))


def error_of(tree, cfg=None) -> str:
    with pytest.raises(config.ConfigError) as err:
        config.load(cfg or base_config(), tree)
    return str(err.value)


def test_a_repeated_key_is_refused_not_overwritten(tree):
    bench = tree / BENCH
    bench.write_text(bench.read_text() + "required_runs: 3\n")
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml" in msg and "key 'required_runs' is given twice" in msg


def test_a_repeated_nested_key_is_refused(tree):
    bench = tree / BENCH
    bench.write_text(bench.read_text().replace("  value: 0.925", "  value: 0.925\n  value: 9.0"))
    assert "key 'value' is given twice" in error_of(tree)


@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_a_target_that_is_not_a_finite_number(tree, bad):
    bench = tree / BENCH
    bench.write_text(bench.read_text().replace("  value: 0.925", f"  value: {bad}"))
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml" in msg and "target.value:" in msg and "not a finite number" in msg


@pytest.mark.parametrize("value, word", [("{datset}", "unknown placeholder {datset}"),
                                         ("{dataset", "not a valid template"),
                                         ("{dataset!r}", "unknown placeholder"),
                                         ("{dataset.x}", "unknown placeholder")])
def test_run_env_placeholders(tree, value, word):
    edit(tree / BENCH, run_env={"DATADIR": value, "MODEL": "{checkpoint}"})
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml: run_env.DATADIR" in msg and word in msg


def test_run_env_literal_braces_are_fine(tree):
    edit(tree / BENCH, run_env={"DATADIR": "{dataset}", "EXTRA": "{{literal}}"})
    config.load(base_config(), tree)


def test_over_long_names(tree):
    long = "b" * 300
    msg = error_of(tree, {**base_config(), "benchmarks": [long]})
    assert "config/config.yaml" in msg and "benchmarks[0]" in msg and "too long" in msg
    msg = error_of(tree, {**base_config(), "system": "s" * 300})
    assert "system:" in msg and "too long" in msg
    edit(tree / "config" / "systems" / "local.yaml", name="n" * 300)
    msg = error_of(tree)
    assert "config/systems/local.yaml" in msg and "name:" in msg


def test_a_seed_too_large_for_a_trainer(tree):
    edit(tree / BENCH, seeds=[10**22, *range(1, 10)])
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml" in msg and "seeds[0]" in msg and "maximum" in msg


def test_a_yaml_error_names_the_file(tree):
    bench = tree / BENCH
    bench.write_text(bench.read_text() + "retries: [1\n")
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml: not valid YAML" in msg


def test_an_implementation_without_run_and_time_is_refused_at_load(tree):
    (tree / "implementations" / "mini_lora" / "run_and_time.sh").unlink()
    msg = error_of(tree)
    assert "config/benchmarks/mini_lora.yaml: implementation.path" in msg and "run_and_time.sh" in msg


@pytest.mark.slow
@pytest.mark.parametrize("text, words", [
    ("benchmarks: [mini_lora\nsystem: local\n", ["config/config.yaml: not valid YAML"]),
    ("benchmarks: [mini_lora]\nsystem: local\nsystem: local-slurm\n", ["config/config.yaml", "'system' is given twice"]),
])
def test_config_yaml_mistakes_stop_snakemake_before_any_job(tmp_path, text, words):
    ws = make_workspace(tmp_path / "ws")
    (ws / "config" / "config.yaml").write_text(text)
    proc = run_snakemake(ws, "--profile", "profiles/local", "-n", check=False, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for word in words:
        assert word in out, out[-3000:]
    assert "Traceback" not in out
    assert not (ws / "results").exists()
