"""The same model on the same corpus, side by side (issue 34): Megatron-LM's gpt_126m next to
Megatron-DeepSpeed's, from the records of the H200 acceptance runs, and in the final report."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from mlrepro import config as mlrepro_config
from mlrepro.scoring import side_by_side
from mlrepro.stages import report as stages_report

REPO = Path(__file__).resolve().parents[3]
RECORDS = REPO / "docs" / "measurements" / "megatron_deepspeed" / "h200x2_acceptance"
SEQ = 2048


def run(lane: str) -> dict:
    return json.loads((RECORDS / lane / "run.json").read_text())


@pytest.fixture
def recorded() -> list[dict]:
    # Megatron-LM first: the reference stack
    return [run("mg"), run("dsc"), run("ds2")]


def test_rows_of_the_recorded_runs(recorded):
    mg, dsc, ds2 = side_by_side.rows(recorded)
    assert [r["benchmark"] for r in (mg, dsc, ds2)] == ["gpt_126m", "gpt_126m_deepspeed_chain", "gpt_126m_deepspeed"]
    assert [r["source"] for r in (mg, dsc, ds2)] == ["megatron", "megatron-deepspeed", "megatron-deepspeed"]
    assert (mg["gpus"], dsc["gpus"], ds2["gpus"]) == (1, 1, 2)
    # one GPU of the fork is as fast alone as each of two (DP2 costs it 4%); Megatron-LM is 3.9x either
    assert mg["tokens_per_s_per_gpu"] > dsc["tokens_per_s_per_gpu"] > ds2["tokens_per_s_per_gpu"]
    assert mg["mfu"] == pytest.approx(0.1952, abs=1e-4) and dsc["peak_mem_gib"] == pytest.approx(40.44, abs=0.01)
    # one FLOP count for both stacks (Megatron-LM's): TFLOP/s per token/s alike
    per_token = [r["tflops_per_gpu"] / r["tokens_per_s_per_gpu"] for r in (mg, dsc, ds2)]
    assert max(per_token) == pytest.approx(min(per_token), rel=0.003)
    # every run evaluated every 100 iterations of 16 sequences: compared where all of them did
    tokens = [s * SEQ for s in (1600, 3200, 4800, 6400)]
    for r in (mg, dsc, ds2):
        assert list(r["val_loss"]) == tokens
    # Megatron-LM's last periodic evaluation, not its end-of-training one on another draw at the same point
    assert mg["val_loss"][6400 * SEQ] == pytest.approx(3.441503)
    assert ds2["val_loss"][6400 * SEQ] == pytest.approx(3.437348)
    for r in (mg, dsc, ds2):
        for t in tokens:
            assert r["val_loss_gap"][t] == pytest.approx(r["val_loss"][t] - mg["val_loss"][t])
    assert ds2["val_loss_gap"][6400 * SEQ] == pytest.approx(3.437348 - 3.441503)
    assert set(mg["val_loss_gap"].values()) == {0.0}


def test_a_run_evaluated_elsewhere_is_interpolated_and_never_extrapolated(recorded):
    mg = recorded[0]
    other = {"benchmark": "other", "source": "megatron-deepspeed",
             "throughput": {"seq_length": SEQ}, "evals": [[800, 4.0], [2400, 3.0], [4800, 2.0]]}
    ref, row = side_by_side.rows([mg, other])
    # 6400 samples is past the other run's last evaluation: not compared
    assert list(row["val_loss"]) == [s * SEQ for s in (1600, 3200, 4800)]
    assert row["val_loss"][1600 * SEQ] == pytest.approx(3.5)
    assert row["val_loss"][3200 * SEQ] == pytest.approx(3.0 - 1.0 / 3)
    assert row["val_loss"][4800 * SEQ] == 2.0
    assert row["val_loss_gap"][4800 * SEQ] == pytest.approx(2.0 - ref["val_loss"][4800 * SEQ])


def test_a_missing_metric_is_n_a(recorded):
    mg, dsc, ds2 = copy.deepcopy(recorded)
    del ds2["throughput"]["peak_mem_gib"], ds2["throughput"]["mfu"]
    no_evals = {"benchmark": "gpt_126m_unscored"}
    table = side_by_side.rows([mg, dsc, ds2, no_evals])
    assert table[2]["peak_mem_gib"] is None and table[2]["mfu"] is None
    # a run without evaluations leaves the others compared where they were
    assert len(table[0]["val_loss"]) == 4
    assert table[3]["tokens_per_s_per_gpu"] is None and set(table[3]["val_loss"].values()) == {None}
    assert set(table[3]["val_loss_gap"].values()) == {None}
    lines = side_by_side.text(table).splitlines()
    ds2_line = next(line for line in lines if line.startswith("gpt_126m_deepspeed "))
    assert ds2_line.count("n/a") == 2 and "39.6" not in ds2_line
    unscored = next(line for line in lines if line.startswith("gpt_126m_unscored"))
    assert unscored.split()[1:] == ["n/a"] * 11


def test_the_benchmark_stands_for_itself_by_its_first_counted_seed():
    runs = [{"seed": 3, "counted": True}, {"seed": 1, "counted": False}, {"seed": 2, "counted": True},
            {"seed": 0, "counted": True, "duplicate": True}]
    assert side_by_side.seed_run(runs)["seed"] == 2
    assert side_by_side.seed_run([{"seed": 1, "counted": False}]) is None


def test_the_recorded_table_is_what_the_printer_prints(capsys):
    lanes = ("mg", "dsc", "ds2")
    assert side_by_side.main([str(RECORDS / lane / "run.json") for lane in lanes]) == 0
    printed = capsys.readouterr().out
    assert printed == (RECORDS / "side_by_side.txt").read_text()
    assert printed.splitlines()[0].split()[:3] == ["benchmark", "stack", "seed"]


def final_report(tmp_path: Path, lanes: dict[str, str]) -> str:
    """The final report of the recorded runs, each lane's records as its benchmark's results."""
    settings = mlrepro_config.load({"benchmarks": list(lanes), "system": "local"}, REPO)
    results = tmp_path / "results"
    for benchmark, lane in lanes.items():
        (results / benchmark).mkdir(parents=True)
        for name in ("verdict.json", "score.json"):
            shutil.copy(RECORDS / lane / name, results / benchmark / name)
    stages_report.final_report(settings, [results / b / "verdict.json" for b in lanes], results / "report.html",
                               results / "summary.csv", results / "summary.json",
                               score_files=[results / b / "score.json" for b in lanes])
    return (results / "report.html").read_text()


def test_the_final_report_puts_two_stacks_of_one_model_side_by_side(tmp_path):
    page = final_report(tmp_path, {"gpt_126m": "mg", "gpt_126m_deepspeed": "ds2"})
    section = page[page.index("<h2 id='same-model'>Same model, same corpus</h2>"):]
    assert "gpt-126m on mini_corpus" in section and "first counted seed" in section
    assert section.index(">gpt_126m<") < section.index(">gpt_126m_deepspeed<")
    assert "308,550" in section and "77,283" in section and "3.4373 (-0.0042)" in section


def test_one_benchmark_has_no_side_by_side(tmp_path):
    page = final_report(tmp_path, {"gpt_126m": "mg"})
    assert "Same model, same corpus" not in page and "verdicts-table" in page


def test_a_benchmark_is_known_by_its_folder_not_its_mlperf_name(tmp_path):
    """An MLPerf benchmark's score.json names MLPerf's benchmark (llama2_lora's says llama2_70b_lora): the report
    takes the configured name from the folder (a CI run on the local Slurm cluster failed on it)."""
    settings = mlrepro_config.load({"benchmarks": ["gpt_126m", "llama2_lora"], "system": "local"}, REPO)
    results = tmp_path / "results"
    for benchmark, lane in (("gpt_126m", "mg"), ("llama2_lora", "ds2")):
        (results / benchmark).mkdir(parents=True)
        for name in ("verdict.json", "score.json"):
            shutil.copy(RECORDS / lane / name, results / benchmark / name)
    score = json.loads((results / "llama2_lora" / "score.json").read_text())
    (results / "llama2_lora" / "score.json").write_text(json.dumps({**score, "benchmark": "llama2_70b_lora"}))
    assert stages_report.same_model(settings, [results / b / "score.json" for b in ("gpt_126m", "llama2_lora")]) == []
