"""The benchmark's `inject_failures:` block (issue 33): read into the benchmark, and a wrong one refused by
the schema with its key named, before any job."""

import pytest
import yaml

from mlrepro import config
import workspace


def load(tree, block):
    bench = tree / "config" / "benchmarks" / "mini_lora.yaml"
    data = yaml.safe_load(bench.read_text())
    data["inject_failures"] = block
    bench.write_text(yaml.safe_dump(data))
    base = yaml.safe_load((workspace.REPO / "config" / "config.yaml").read_text())
    return config.load({**base, "benchmarks": ["mini_lora"]}, tree).benchmark("mini_lora")


def test_the_block_reaches_the_benchmark(tree):
    assert load(tree, {"mtbf_seconds": 45, "seed": 3}).inject_failures == {"mtbf_seconds": 45, "seed": 3}


@pytest.mark.parametrize("block, named", [
    ({"mtbf_seconds": 0}, r"inject_failures.mtbf_seconds: 0 is less than or equal to the minimum of 0"),
    ({"seed": 1}, r"inject_failures: 'mtbf_seconds' is a required property"),
    ({"mtbf_seconds": 45, "rate": 2}, r"inject_failures: unknown key 'rate'"),
    ({"mtbf_seconds": "often"}, r"inject_failures.mtbf_seconds: 'often' is not of type 'number'"),
])
def test_a_wrong_block_is_refused_with_its_key_named(tree, block, named):
    with pytest.raises(config.ConfigError, match=r"mini_lora.yaml[\s\S]*" + named):
        load(tree, block)
