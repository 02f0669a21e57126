"""The final report of a real workflow run with two benchmarks (two miniatures).

mini_lora is compared with the reference runs it ships; its twin ships none, so its seeds
are compared with each other only. The default target builds results/report.html, which
opens with the verdict table and lists both, each row linking to its own report, and
`snakemake --report` carries it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from unit.scoring.test_verdict import CHROMIUM, dom  # tests/ is on sys.path (pyproject)
from workspace import make_workspace, run_snakemake

pytestmark = pytest.mark.slow

PROFILE = ("--profile", "profiles/local")


@pytest.fixture(scope="module")
def two_benchmarks(mini_lora_data, tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("final") / "ws", quick=True, data_from=mini_lora_data)
    bench_dir = ws / "config" / "benchmarks"
    mini = yaml.safe_load((bench_dir / "mini_lora.yaml").read_text())
    # Few seeds keep the test short; the verdict machinery is the same at ten.
    (bench_dir / "mini_lora.yaml").write_text(yaml.safe_dump({**mini, "required_runs": 2}))
    twin = {k: v for k, v in mini.items() if k != "reference"}
    (bench_dir / "mini_twin.yaml").write_text(yaml.safe_dump(
        {**twin, "name": "mini_twin", "required_runs": 2, "env": {**twin.get("env", {}), "SUBMISSION_BENCHMARK": "mini_twin"}}))
    cfg = yaml.safe_load((ws / "config" / "config.yaml").read_text())
    (ws / "config" / "config.yaml").write_text(yaml.safe_dump({**cfg, "benchmarks": ["mini_lora", "mini_twin"],
                                                               "system": "local"}))
    run_snakemake(ws, *PROFILE, timeout=900)
    return ws


def test_summary_lists_every_benchmark(two_benchmarks):
    results = two_benchmarks / "results"
    records = json.loads((results / "summary.json").read_text())
    assert [r["benchmark"] for r in records] == ["mini_lora", "mini_twin"]
    lora, twin = records
    # two seeds against reference runs that vary 31% per sample: most likely "inconclusive", which the why explains
    assert lora["reference_kind"] == "reference runs" and lora["verdict"] in ("reproduced", "inconclusive",
                                                                            "not reproduced")
    assert lora["reference_score_minutes"] > 0 and lora["p_time_per_sample"] is not None
    assert twin["reference_kind"] == "none" and twin["verdict"] == "seeds only" and twin["p_time_to_train"] is None
    assert "compared with each other only" in twin["why"]
    for r in records:
        assert (results / r["report"]).is_file()
    assert (results / "summary.csv").read_text().splitlines()[0].startswith("benchmark,system,")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_final_report_opens_with_the_verdict_table(two_benchmarks, tmp_path):
    results = two_benchmarks / "results"
    page = dom(results / "report.html", tmp_path)
    html = (results / "report.html").read_text()
    body = html[html.index("<body>") + len("<body>"):]
    # the table first (in a box of its own that scrolls where the page is narrower than the table)
    assert body.startswith("<h1>") and body[body.index("</h1>") + 5:].startswith(
        "<div class='scroll'><table id='verdicts-table'>")
    rows = {r["benchmark"]: r["cells"] for r in page.rows if r["benchmark"]}
    assert set(rows) == {"mini_lora", "mini_twin"}
    verdict_column = page.rows[0]["cells"].index("verdict")
    assert verdict_column == 0 and rows["mini_twin"][verdict_column] == "seeds only"
    twin = dom(results / "mini_twin" / "report.html", tmp_path)
    assert twin.ids["verdict-status"] == "SEEDS ONLY" and "tests" not in twin.ids
    assert "median" in twin.ids["seed-spread"]
    lora = dom(results / "mini_lora" / "report.html", tmp_path)
    assert "reference runs" in lora.ids["reference-source"] and "geometric means" in lora.ids["method"]
    assert "What these runs can tell" in lora.ids["power"]


def test_snakemake_report_carries_the_final_report(two_benchmarks, tmp_path):
    run_snakemake(two_benchmarks, *PROFILE, "--report", str(tmp_path / "report.zip"), timeout=300)
    archive = zipfile.ZipFile(tmp_path / "report.zip")
    names = [Path(n).name for n in archive.namelist() if "/data/raw/" in n]
    # the two benchmarks' pages and the final one
    assert names.count("report.html") == 3 and names.count("distribution.svg") == 2 and "summary.csv" in names
    final = (two_benchmarks / "results" / "report.html").read_bytes()
    assert any(archive.read(n) == final for n in archive.namelist() if n.endswith("report.html"))
