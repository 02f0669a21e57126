"""The reports' cost section and summary.csv's cost columns (issue 24)."""

from __future__ import annotations

from mlrepro.scoring import cost_report

SCORE = {
    "cost": {"gpu_hours": 0.06, "failed_gpu_hours": 0.01, "attempts": 4, "failed_attempts": 1, "energy_kwh": None,
             "estimated": False, "unit": "CPU-hours",
             "seeds": {"2": {"attempts": 1, "failed_attempts": 0, "elapsed_s": 40, "gpu_hours": 0.02,
                             "failed_gpu_hours": 0},
                       "1": {"attempts": 2, "failed_attempts": 1, "elapsed_s": 60, "gpu_hours": 0.03,
                             "failed_gpu_hours": 0.01}},
             "planned": {"seeds": 10, "nodes": 1, "gpus_per_node": 2, "walltime_minutes": 15,
                         "upper_bound_gpu_hours": 5.0, "expected_gpu_hours": 0.07, "reference_mean_minutes": 0.21}},
    "early_stop": {"message": "stopped after 3 of 10 seeds: not reproduced with probability >= 0.999, saving 0.14 "
                              "CPU-hours; not a complete MLPerf result", "why": "w", "required": 10,
                   "stopped_after": 3, "saved_gpu_hours": 0.14},
    "running_verdict": {"seeds_finished": 3, "seeds_required": 10, "p_reproduced": 0.0, "method": "simulated"},
}


def test_section_shows_planned_against_spent_failures_and_the_stop():
    html = cost_report.section(SCORE)
    assert "id='early-stop'" in html and "stopped after 3 of 10 seeds" in html
    assert "<th>spent</th><td class='num'>0.06</td>" in html
    assert "<th>of which failed attempts</th><td class='num'>0.01</td>" in html
    assert "<th>planned, upper bound</th><td class='num'>5</td>" in html
    assert "<th>saved by the early stop</th><td class='num'>0.14</td>" in html
    assert "spent 1.2% of the planned upper bound" in html
    assert html.index("<td>1</td>") < html.index("<td>2</td>")  # seeds in order
    assert "P(reproduced) = 0.000" in html and "benchmarks/false_stop.py" in html


def test_no_cost_no_section_and_summary_columns():
    assert cost_report.section({}) == ""
    cols = cost_report.summary_columns(SCORE)
    assert cols["spent_gpu_hours"] == 0.06 and cols["planned_gpu_hours"] == 5.0 and cols["cost_unit"] == "CPU-hours"
    assert cols["early_stop"].startswith("stopped after 3")
    assert set(cols) == set(cost_report.COLUMNS)
    assert cost_report.summary_columns({})["spent_gpu_hours"] is None
