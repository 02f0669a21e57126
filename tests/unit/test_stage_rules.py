"""Rule r of workflow/rules/X.smk is the function mlrepro.stages.X.r, and every such function is a rule of X.smk."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from mlrepro import stages

RULES_DIR = Path(__file__).resolve().parents[2] / "workflow" / "rules"
RULE = re.compile(r"^(?:rule|checkpoint)\s+(\w+)\s*:", re.MULTILINE)


def test_every_rule_has_its_stage_function_and_every_stage_function_its_rule():
    files = {p.stem: set(RULE.findall(p.read_text())) for p in RULES_DIR.glob("*.smk")}
    assert files.pop("common") == set(), "common.smk holds no rule"
    assert set(files) == set(stages.RULE_FILES)
    for name, rules in files.items():
        module = importlib.import_module(f"mlrepro.stages.{name}")
        assert set(stages.rules(module)) == rules, name
        for rule in rules:
            assert stages.find(rule) == (module, getattr(module, rule))


def test_every_rule_calls_the_one_dispatcher_and_has_a_log():
    """Through the one stage script, or, for the per-seed rules, through `python -m mlrepro.stages`
    (common.smk's seed_stage): a dry run reads a script rule's source once per job."""
    shell_rules = set()
    for path in RULES_DIR.glob("*.smk"):
        blocks = re.split(r"^(?=(?:rule|checkpoint) )", path.read_text(), flags=re.M)
        for block in (b for b in blocks if re.match(r"(?:rule|checkpoint) ", b)):
            name = block.split()[1].rstrip(":")
            assert "log:" in block, f"{path.name}: {name}"
            if f'shell:\n        seed_stage("{name}")' in block:
                shell_rules.add(name)
            else:
                assert '"../scripts/stage.py"' in block, f"{path.name}: {name}"
    assert shell_rules == {"train_seed", "score_seed"}
    assert [p.name for p in (RULES_DIR.parent / "scripts").glob("*.py")] == ["stage.py"]


def test_the_shell_rules_job_is_what_a_script_rule_is_given(monkeypatch):
    from mlrepro.stages import CONFIG_ENV
    from mlrepro.stages.__main__ import job_from_command

    command = ["train_seed", "--wildcard", "benchmark=mini_lora", "--wildcard", "seed=7", "--input", "a", "b",
               "--output", "results/mini_lora/seed_7/mllog.txt", "--log", "results/mini_lora/seed_7/run.log",
               "--threads", "2"]
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    with pytest.raises(SystemExit):
        job_from_command(command)
    monkeypatch.setenv(CONFIG_ENV, '{"system": "local", "benchmarks": ["mini_lora"]}')
    job = job_from_command(command)
    assert (job.rule, job.wildcards.benchmark, job.wildcards.seed, job.threads) == ("train_seed", "mini_lora", "7", 2)
    assert job.input == ["a", "b"] and job.output == ["results/mini_lora/seed_7/mllog.txt"]
    assert job.config == {"system": "local", "benchmarks": ["mini_lora"]}
    module, fn = stages.find(job.rule)
    args, _ = fn.snakemake_arguments(job, "settings")
    assert args == ("settings", "mini_lora", 7, Path("results/mini_lora/seed_7/mllog.txt"),
                    Path("results/mini_lora/seed_7/run.log"))
