"""The reports' cost section and summary.csv's cost columns (issue 24)."""

from __future__ import annotations

import pytest

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


CHROMIUM = __import__("shutil").which("chromium") or __import__("shutil").which("chromium-browser")


def _dom(page, tmp_path) -> str:
    import subprocess

    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_both_reports_show_the_cost_in_headless_chromium(tmp_path):
    import json

    from mlrepro.scoring import summary
    from mlrepro.scoring.report import write_report

    score = {**SCORE, "benchmark": "mini_lora", "runs": [], "valid": False, "reasons": [SCORE["early_stop"]["message"]],
             "target": {"metric": "eval_accuracy", "value": 0.925, "direction": "<="}, "rcp": {"scaling_factor": 1.0}}
    page = write_report(score, None, tmp_path / "mini_lora" / "report.html", verdict_html=cost_report.section(score))
    dom = _dom(page, tmp_path)
    assert 'id="cost-table"' in dom and 'id="early-stop"' in dom and "stopped after 3 of 10 seeds" in dom
    assert "planned, upper bound" in dom and 'id="running-verdict"' in dom
    verdict = {"benchmark": "mini_lora", "system": {"name": "local-slow"}, "reference": {"label": "ref", "kind": "x"},
               "verdict": "not valid", "why": ["stopped"], **{k: SCORE[k] for k in ("cost", "early_stop")}}
    vfile = tmp_path / "mini_lora" / "verdict.json"
    vfile.write_text(json.dumps(verdict))
    table = summary.write_final_report([vfile], tmp_path / "report.html", tmp_path / "summary.csv",
                                       tmp_path / "summary.json")
    assert table.loc[0, "spent_gpu_hours"] == 0.06 and table.loc[0, "planned_gpu_hours"] == 5.0
    assert "spent_gpu_hours" in (tmp_path / "summary.csv").read_text().splitlines()[0]
    final = _dom(tmp_path / "report.html", tmp_path)
    assert "0.06 / 5 CPU-hours" in final and 'id="cost-total"' in final
    assert "Cost in total: 0.06 CPU-hours spent of 5 planned" in final


def test_seeds_the_early_stop_did_not_run_say_so():
    score = {**SCORE, "cost": {**SCORE["cost"], "seeds": {**SCORE["cost"]["seeds"], "3": {
        "attempts": 0, "failed_attempts": 0, "elapsed_s": 0, "gpu_hours": 0, "failed_gpu_hours": 0, "stopped": True}}}}
    html = cost_report.section(score)
    assert "<td>3</td><td colspan='5' class='small'>not run: the early stop settled the reproduction</td>" in html
