"""The opt-in early stop through the real snakemake on CPU (issue 24).

The reference here is the shipped mini_lora runs with every time divided by 20: a machine twenty
times faster than any that runs the tests, so this machine's seeds are certainly "not reproduced"
against it and the outcome is settled after min_seeds (2) seeds, whatever the machine's speed.
Four seeds are configured, so the stop saves two. (The healthy-machine run of all ten seeds and the
slowed system against the shipped reference are the acceptance runs in the closing report: their
outcome depends on the machine's speed, which a test cannot promise.)
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from workspace import make_workspace, run_snakemake

pytestmark = pytest.mark.slow


def _compressed(text: str, factor: float) -> str:
    out = []
    t0 = None
    for line in text.splitlines():
        m = re.search(r'"time_ms": (\d+)', line)
        if m:
            t = int(m.group(1))
            t0 = t if t0 is None else t0
            line = line.replace(m.group(0), f'"time_ms": {int(t0 + (t - t0) * factor)}')
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def stopped(mini_lora_data, tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("early") / "ws", data_from=mini_lora_data)
    ref = ws / "implementations" / "mini_lora" / "fast_reference"
    shutil.copytree(ws / "implementations" / "mini_lora" / "reference", ref)
    for log in ref.glob("result_*.txt"):
        log.write_text(_compressed(log.read_text(), 1 / 20))
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    text = bench.read_text().replace("required_runs: 10", "required_runs: 4")
    text = text.replace("runs: implementations/mini_lora/reference", "runs: implementations/mini_lora/fast_reference")
    bench.write_text(text + "early_stop: {confidence: 0.99, min_seeds: 2}\n")
    proc = run_snakemake(ws, "--profile", "profiles/local", "--cores", "2", "results/mini_lora/score.json",
                         timeout=1500)
    return ws, proc


def test_stops_after_two_of_four_and_says_so(stopped):
    ws, _ = stopped
    bench = ws / "results" / "mini_lora"
    decision = json.loads((bench / "early_stop.json").read_text())
    assert decision["stopped_after"] == 2 and decision["required"] == 4
    stopped_seeds = sorted(int(p.parent.name.split("_")[1]) for p in bench.glob("seed_*/stopped.json"))
    assert len(stopped_seeds) == 2
    for s in stopped_seeds:  # never run: no attempt folder, nothing spent
        assert not list((bench / f"seed_{s}").glob("attempt_*"))
    score = json.loads((bench / "score.json").read_text())
    assert score["valid"] is False and score["complete_mlperf_result"] is False
    assert score["early_stop"]["message"].startswith("stopped after 2 of 4 seeds: not reproduced with probability >= 0.99")
    assert score["cost"]["gpu_hours"] > 0 and score["early_stop"]["saved_gpu_hours"] > 0
    assert json.loads((bench / "verdict.json").read_text())["verdict"] == "not reproduced"
    report = (bench / "report.html").read_text()
    assert "stopped after 2 of 4 seeds" in report and "id='cost-table'" in report


def _losses_scaled(text: str, factor: float) -> str:
    """The runs' evaluation losses times `factor` (their samples and times as they were)."""
    out = []
    for line in text.splitlines():
        if '"key": "eval_accuracy"' in line:
            line = re.sub(r'"value": ([0-9.eE+-]+)', lambda m: f'"value": {float(m.group(1)) * factor}', line)
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def diverged(stopped):
    """Issue 24 item 3, end to end: the stopped workspace (its data prepared) set going again, against a
    reference whose losses are half this machine's at every point, with cancel_diverged on: seed 3
    leaves the band within its first evaluations and is cancelled long before it could converge."""
    ws, _ = stopped
    bench_dir = ws / "results" / "mini_lora"
    (bench_dir / "early_stop.json").unlink()
    shutil.rmtree(bench_dir / "seed_3")
    ref = ws / "implementations" / "mini_lora" / "better_reference"
    shutil.copytree(ws / "implementations" / "mini_lora" / "reference", ref)
    for log in ref.glob("result_*.txt"):
        log.write_text(_losses_scaled(log.read_text(), 0.5))
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    text = bench.read_text().replace("runs: implementations/mini_lora/fast_reference",
                                     "runs: implementations/mini_lora/better_reference")
    bench.write_text(text.replace("early_stop: {confidence: 0.99, min_seeds: 2}",
                                  "early_stop: {confidence: 0.99, min_seeds: 2, cancel_diverged: true}"))
    proc = run_snakemake(ws, "--profile", "profiles/local", "--cores", "2", "results/mini_lora/seed_3/mllog.txt",
                         timeout=900, check=False)
    return bench_dir / "seed_3", proc


def test_a_seed_outside_the_reference_band_is_cancelled_as_diverged_and_its_cost_counted(diverged):
    seed, proc = diverged
    assert proc.returncode != 0, "a diverged seed's job must fail: it has no result"
    failure = json.loads((seed / "failure.json").read_text())
    assert failure["state"] == "DIVERGED" and failure["reason"].startswith("diverged: "), failure
    band = json.loads((seed / "diverged.json").read_text())
    assert band["lost"] is True and band["worse"] >= 2
    attempt = json.loads((seed / "attempt_1" / "attempt.json").read_text())
    assert attempt["state"] == "DIVERGED" and attempt["elapsed_s"] > 0  # what it ran is spent, and counted
    assert not (seed / "mllog.txt").exists() and not list(seed.glob("attempt_2"))  # cancelled, never retried
    log = (seed / "attempt_1" / "run.log").read_text()
    assert '"run_start"' in log and '"run_stop"' not in log  # stopped before it could converge
