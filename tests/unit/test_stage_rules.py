"""Rule r of workflow/rules/X.smk is the function mlrepro.stages.X.r, and every such function is a rule of X.smk."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

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


def test_every_rule_calls_the_one_stage_script_and_has_a_log():
    checked = set()
    for path in RULES_DIR.glob("*.smk"):
        blocks = re.split(r"^(?=(?:rule|checkpoint) )", path.read_text(), flags=re.M)
        for block in (b for b in blocks if re.match(r"(?:rule|checkpoint) ", b)):
            name = block.split()[1].rstrip(":")
            assert "log:" in block, f"{path.name}: {name}"
            assert '"../scripts/stage.py"' in block, f"{path.name}: {name}"
            checked.add(name)
    # Every rule is checked, a file's first too (the split once skipped it: score_seed went unchecked).
    assert checked == {r for p in RULES_DIR.glob("*.smk") for r in RULE.findall(p.read_text())}
    assert [p.name for p in (RULES_DIR.parent / "scripts").glob("*.py")] == ["stage.py"]
