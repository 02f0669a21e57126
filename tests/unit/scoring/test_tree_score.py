"""`mlrepro score TREE`: published MLPerf Training v5.0 results scored exactly as the official summarizer does.

The fixture is a sample of mlcommons/training_results_v5.0 (tests/fixtures/mlperf_v5_sample,
made by its make_sample.sh): every v5.0 benchmark, five submitters, runs the summarizer drops and
published scaling.json files. The official result_summarizer (installed with mlperf-logging) runs
on a copy of it in the test (a few seconds) and every row must agree.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mlrepro import cli
from mlrepro.scoring import report
from mlrepro.scoring import summarizer_compare, tree_score
import workspace

SAMPLE = workspace.FIXTURES / "mlperf_v5_sample"
SUBMITTERS = ["AMD", "ASUSTeK", "Dell", "NVIDIA", "tinycorp"]


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _official(tree: Path, workdir: Path) -> pd.DataFrame:
    """result_summarizer over every submitter of `tree`, on a copy (it rewrites scaling.json)."""
    copy = workdir / "official_copy"
    shutil.copytree(tree, copy)
    csv = workdir / "official.csv"
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.result_summarizer", f"{copy}/{{*}}", "training",
                           "5.0.0", "--csv", str(csv)], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    official = summarizer_compare.summarizer_rows(workdir / "official_detailed.csv")
    # Its URLs name the submitter and system file, not the folder it read: the same in both.
    return official


@pytest.fixture(scope="module")
def sample_with_a_failed_folder(tmp_path_factory) -> Path:
    """The sample, plus one folder where too many runs failed (no score)."""
    tree = tmp_path_factory.mktemp("tree") / "v5"
    shutil.copytree(SAMPLE, tree)
    folder = tree / "tinycorp" / "results" / "tinybox_green" / "retinanet"  # result_4 fails already
    log = folder / "result_0.txt"
    log.write_text("".join(ln for ln in log.read_text(encoding="latin-1").splitlines(keepends=True)
                           if '"run_stop"' not in ln), encoding="latin-1")
    return tree


def test_every_result_equals_the_official_summarizer(sample_with_a_failed_folder, tmp_path):
    tree = sample_with_a_failed_folder
    before = _tree_digest(tree)
    ours, rows = tree_score.score_tree([tree], ruleset="5.0.0")
    assert _tree_digest(tree) == before, "scoring must not write into the tree"
    official = _official(tree, tmp_path)

    both = summarizer_compare.compare_with_summarizer(ours, official)
    assert len(both) == 9 and both["same"].all(), both[~both["same"]].to_string()
    assert set(ours["benchmark"]) == {"bert", "dlrm_dcnv2", "retinanet", "stable_diffusion", "llama2_70b_lora",
                                      "rgat", "llama31_405b"}
    assert set(ours["submitter"]) == set(SUBMITTERS)
    # Spot checks against the published numbers and what the folders hold.
    lora = ours[(ours.submitter == "Dell") & (ours.benchmark == "llama2_70b_lora")].iloc[0]
    assert lora.runs_found == 10 and lora.runs_used == 9 and lora.valid  # one run may fail
    assert "result_9.txt dropped" in lora.run_notes
    scaled = ours[ours.rcp_scaling_factor > 1]
    assert len(scaled) >= 3 and (scaled.rcp_factor - scaled.rcp_scaling_factor).abs().max() < 1e-9
    failed = ours[(ours.submitter == "tinycorp") & (ours.benchmark == "retinanet")].iloc[0]
    assert pd.isna(failed.time_to_train) and not failed.valid
    assert "2 runs dropped (at most 1 may be)" in failed.reasons
    assert failed.RCP == "Unknown state"  # the summarizer's word for "Insufficient convergence"


def test_cli_writes_csv_and_json(tmp_path, capsys):
    csv, js, page = tmp_path / "t.csv", tmp_path / "t.json", tmp_path / "t.html"
    rc = cli.main(["score", str(SAMPLE / "Dell"), str(SAMPLE / "AMD"), "--csv", str(csv), "--json", str(js),
                   "--html", str(page)])
    assert rc == 0
    text = page.read_text()
    assert text.count("<tr class='ok'>") == 4 and "<table id='tree'>" in text
    assert "2.999" in text and "result_9.txt dropped" in text  # Dell's llama2_70b_lora, its dropped run
    table = pd.read_csv(csv)
    assert list(table.columns[:12]) == tree_score.SYSTEM_COLUMNS  # the summarizer's system columns first
    assert {"time_to_train", "GBS", "samples_to_converge", "RCP", "rcp_scaling_factor", "rcp_factor",
            "runs_used", "reasons"} <= set(table.columns)
    assert len(table) == 4 and table["valid"].all()
    data = json.loads(js.read_text())
    assert data["ruleset"] == "5.0.0" and len(data["rows"]) == 4
    assert all(len(r["runs"]) == r["runs_found"] for r in data["rows"])
    assert "4 rows, 4 with a score, 4 valid" in capsys.readouterr().out


def test_a_folder_it_cannot_score_says_why_and_the_others_are_scored(tmp_path):
    root = tmp_path / "round"
    shutil.copytree(SAMPLE / "tinycorp", root / "tinycorp")
    shutil.copytree(SAMPLE / "AMD", root / "AMD")
    results = root / "tinycorp" / "results"
    # a system folder without its systems/<name>.json
    shutil.copytree(results / "tinybox_green" / "bert", results / "ghost" / "bert")
    # a system description that is not JSON, and one that lacks a field the summarizer needs
    shutil.copytree(results / "tinybox_green" / "bert", results / "broken" / "bert")
    (root / "tinycorp" / "systems" / "broken.json").write_text("{not json")
    shutil.copytree(results / "tinybox_green" / "bert", results / "nofield" / "bert")
    desc = json.loads((root / "tinycorp" / "systems" / "tinybox_green.json").read_text())
    del desc["framework"]
    (root / "tinycorp" / "systems" / "nofield.json").write_text(json.dumps(desc))
    # a benchmark v5.0 does not have, and a submitter folder without systems/
    shutil.copytree(results / "tinybox_green" / "retinanet", results / "tinybox_green" / "resnet")
    (root / "half" / "results").mkdir(parents=True)

    table, _ = tree_score.score_tree([root, tmp_path / "missing"], ruleset="5.0.0")
    why = {(Path(r.folder).parent.name, Path(r.folder).name): r.reasons for r in table.itertuples()}
    assert "Missing" in why[("ghost", "bert")] and "systems/ghost.json" in why[("ghost", "bert")]
    assert "not valid JSON" in why[("broken", "bert")]
    assert '"framework" field missing' in why[("nofield", "bert")]
    assert "not a benchmark of MLPerf training 5.0.0" in why[("tinybox_green", "resnet")]
    assert "needs both systems/ and results/" in why[("round", "half")]
    assert "does not exist" in why[(tmp_path.name, "missing")]
    scored = table[table.time_to_train.notna()]
    assert set(zip(scored.submitter, scored.benchmark)) >= {("tinycorp", "bert"), ("tinycorp", "retinanet"),
                                                            ("AMD", "llama2_70b_lora")}
    assert not table[table.reasons.str.len() > 0].valid.any()
    view = report.tree_table_html(table)
    assert view.count("<tr class='bad'>") == int((~table.valid.astype(bool)).sum()) >= 6
    assert "not valid JSON" in view


def test_unknown_ruleset_is_refused(capsys):
    assert cli.main(["score", str(SAMPLE), "--ruleset", "9.9.9"]) == 2
    assert "no training ruleset '9.9.9'" in capsys.readouterr().err


def test_one_folder_with_benchmark_agrees_with_the_tree(tmp_path):
    """`mlrepro score FOLDER --benchmark B` (the same engine, one folder) gives the tree's number for
    epoch-based benchmarks and two-part targets too, RCP scaling included."""
    from mlrepro.scoring.rules import rules_for

    table, _ = tree_score.score_tree([SAMPLE / "Dell"], ruleset="5.0.0", jobs=2)
    for bench in ("rgat", "stable_diffusion"):
        row = table[table.benchmark == bench].iloc[0]
        out = tmp_path / f"{bench}.json"
        rc = cli.main(["score", row.folder, "--benchmark", bench, "--json", str(out)])
        assert rc == 0, bench
        score = json.loads(out.read_text())
        assert abs(score["score_minutes"] - row.time_to_train) < 1e-3
        assert abs(score["rcp"]["scaling_factor"] - row.rcp_scaling_factor) < 1e-9
        if bench == "rgat":
            assert abs(score["rcp"]["recomputed_factor"] - row.rcp_factor) < 1e-9 and row.rcp_factor > 1
    serial, _ = tree_score.score_tree([SAMPLE / "Dell"], ruleset="5.0.0")
    assert serial.time_to_train.tolist() == table.time_to_train.tolist()
    assert rules_for("rgat").required_runs == 10
