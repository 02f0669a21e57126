"""The early stop read from and written to the reproduction's folders (issue 24)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlrepro import config
from mlrepro.paths import AttemptPaths
from mlrepro.scoring import cost, early_stop
from mlrepro.scoring import rules as scoring_rules

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "implementations" / "mini_lora" / "reference"


@dataclass(frozen=True)
class _System:
    name: str = "local-slow"
    early_stop: object = None


def _slowed(text: str, factor: float) -> str:
    """The same MLLOG with every time after the first stretched by `factor` (a slower machine)."""
    lines = []
    t0 = None
    for line in text.splitlines():
        if ":::MLLOG" in line:
            head, body = line.split(":::MLLOG ", 1)
            rec = json.loads(body)
            t0 = rec["time_ms"] if t0 is None else t0
            rec["time_ms"] = int(t0 + (rec["time_ms"] - t0) * factor)
            line = head + ":::MLLOG " + json.dumps(rec)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _seeds(root: Path, factor: float, count: int, elapsed_s: float = 30) -> None:
    for i in range(count):
        folder = root / "results" / "mini_lora" / f"seed_{i + 1}"
        (folder / "attempt_1").mkdir(parents=True)
        (folder / "mllog.txt").write_text(_slowed((REFERENCE / f"result_{i}.txt").read_text(), factor))
        (folder / "attempt_1" / AttemptPaths.RECORD).write_text(json.dumps(cost.attempt_record(
            1, "local", nodes=1, gpus_per_node=2, start=None, end=None, elapsed_s=elapsed_s * factor,
            state="COMPLETED")))


@pytest.fixture
def bench():
    return config.load_benchmark(ROOT, "mini_lora")


def test_a_slow_machine_is_stopped_after_three_seeds_and_the_decision_is_kept(tmp_path, bench):
    _seeds(tmp_path, 3.0, 3)
    rules = scoring_rules.for_benchmark(bench)
    system = _System(early_stop={"confidence": 0.99, "min_seeds": 3})
    decision = early_stop.evaluate(tmp_path, bench, system, rules, gpus_per_node=2, device="cpu")
    assert decision is not None and decision["stopped_after"] == 3 and decision["required"] == 10
    assert decision["p_not_reproduced"] >= decision["threshold"] > 0.99
    assert decision["spent_gpu_hours"] == pytest.approx(3 * 90 * 2 / 3600)
    assert decision["saved_gpu_hours"] == pytest.approx(7 * 90 * 2 / 3600)
    assert decision["message"].startswith("stopped after 3 of 10 seeds: not reproduced with probability >= 0.999,")
    assert "CPU-hours" in decision["message"]
    assert early_stop.read_decision(tmp_path, "mini_lora") == decision
    # Settled once: later seeds read the same decision.
    assert early_stop.evaluate(tmp_path, bench, system, rules, 2, "cpu") == decision


def test_a_healthy_machine_or_no_policy_goes_on(tmp_path, bench):
    _seeds(tmp_path, 1.0, 4)
    rules = scoring_rules.for_benchmark(bench)
    assert early_stop.evaluate(tmp_path, bench, _System(early_stop=True), rules, 2, "cpu") is None
    assert early_stop.evaluate(tmp_path, bench, _System(early_stop=None), rules, 2, "cpu") is None
    assert early_stop.read_decision(tmp_path, "mini_lora") is None
    running = early_stop.running(tmp_path, bench, rules, simulations=500)
    # the shipped runs vary 31% per sample: ten cannot show a reproduction within 5%, and say so
    assert running["seeds_finished"] == 4 and running["p_reproduced"] == 0
    assert running["p_inconclusive"] > 0.5 > running["p_not_reproduced"]


def test_a_stopped_seed_is_marked_and_not_counted_as_finished(tmp_path, bench):
    _seeds(tmp_path, 1.0, 3)
    folder = tmp_path / "results" / "mini_lora" / "seed_4"
    early_stop.mark_stopped(folder, folder / "mllog.txt", {"message": "stopped after 3 of 10 seeds"}, cancelled=False)
    assert early_stop.is_stopped(folder) and (folder / "mllog.txt").read_text() == ""
    assert sorted(early_stop.finished_runs(tmp_path, "mini_lora", scoring_rules.for_benchmark(bench))) == [1, 2, 3]


def test_the_benchmark_policy_wins_over_the_systems_and_bad_values_name_the_file(bench):
    @dataclass(frozen=True)
    class _Bench:
        early_stop: object
        source: str = "config/benchmarks/mini_lora.yaml"

    assert early_stop.policy_of(_Bench({"confidence": 0.95}), _System(early_stop=True)).confidence == 0.95
    assert early_stop.policy_of(_Bench(None), _System(early_stop={"min_seeds": 4})).min_seeds == 4
    with pytest.raises(ValueError, match="config/systems/local-slow.yaml: early_stop.confidence"):
        early_stop.policy_of(_Bench(None), _System(early_stop={"confidence": 2}))
