"""`mlrepro plan --trial K` (mlrepro.kinds.plan_trial): the K best layouts run as seed jobs through
the launcher every seed uses, the measured fastest chosen, predicted against measured kept, and
their cost counted in the benchmark's; here on CPU ranks with the Megatron-LM stand-in
(tests/fixtures/megatron_standin) on the local scheduler."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mlrepro import paths
from mlrepro.cli import main
from mlrepro.corpus import blend
from mlrepro.formats import indexed
from mlrepro.kinds import plan_trial
from mlrepro.plan.layout import Layout
from mlrepro.scoring import cost
from workspace import FIXTURES, make_workspace


def _workspace(dest: Path) -> Path:
    """The workflow with a two-rank CPU system (the 2x H100 figures) and a one-document blend."""
    ws = make_workspace(dest)
    system = (ws / "config/systems/device-h100x2.yaml").read_text()
    (ws / "config/systems/cpu-h100x2.yaml").write_text(
        system.replace("name: device-h100x2", "name: cpu-h100x2").replace("device: cuda", "device: cpu"))
    corpus = ws / "resources" / "corpora" / "mini_corpus"
    prefix = corpus / "preprocessed" / "train_chunk_0_text_document"
    prefix.parent.mkdir(parents=True)
    w = indexed.IndexedWriter(f"{prefix}.bin")
    w.add_document(np.arange(256, dtype=np.uint16) % 97)
    w.finalize(f"{prefix}.idx")
    blend.write_blend([str(prefix)], corpus / "data_prefix.json")
    (corpus / "tokenizer").mkdir()
    (corpus / "tokenizer" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(97)}))
    shutil.copytree(FIXTURES / "megatron_standin", ws / "standin")
    return ws


@pytest.mark.slow
def test_trial_runs_the_top_candidates_as_seed_jobs_and_chooses_the_fastest(tmp_path, capsys, monkeypatch):
    ws = _workspace(tmp_path / "ws")
    # run_and_time.sh starts torchrun: this interpreter's, as an activated environment would have it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    rc = main(["plan", "--benchmark", "gpt_126m", "--gbs", "4", "--system", "cpu-h100x2", "--root", str(ws),
               "--trial", "2", "--trial-iterations", "4", "--megatron", str(ws / "standin")])
    out = capsys.readouterr().out
    assert rc == 0, out
    record = json.loads((paths.trials_dir(ws, "gpt_126m") / "trials.json").read_text())
    rows = record["candidates"]
    assert [r["rank"] for r in rows] == [1, 2] and len({r["tag"] for r in rows}) == 2
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 and r["error_pct"] is not None for r in rows)
    fastest = min(rows, key=lambda r: r["measured_s"])
    assert record["chosen"]["tag"] == fastest["tag"] and f"chosen: {fastest['layout']}" in out
    # each candidate ran as a seed job: its attempt folder and attempt.json, its cost counted
    for r in rows:
        folder = Path(r["folder"])
        assert (folder / "plan.json").is_file() and (folder / "attempt_1" / "attempt.json").is_file()
        assert "torchrun" in (folder / "launch.sh").read_text()
        assert r["gpu_hours"] > 0
    assert record["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows)) and record["unit"] == "CPU-hours"
    spent = cost.benchmark_cost(paths.benchmark_dir(ws, "gpt_126m"), 2)
    assert set(spent["trials"]) == {r["tag"] for r in rows}
    assert spent["gpu_hours"] == pytest.approx(record["gpu_hours"])
    # the measured steps are kept for the system, and the chosen layout can be read back
    kept = json.loads(paths.observed_json(ws, "cpu-h100x2").read_text())["rows"]
    assert {k["source"] for k in kept} == {f"trial gpt_126m/{r['tag']}" for r in rows}
    assert (paths.calibration_json(ws, "cpu-h100x2")).is_file()
    assert plan_trial.read_chosen(ws, "gpt_126m").gbs == 4


def test_a_layouts_short_form_reads_back():
    for lay in (Layout(dp=2, mbs=2, ga=1), Layout(tp=2, pp=2, vpp=4, mbs=1, ga=16, sp=True, recompute="full")):
        assert plan_trial._layout_of(lay.short()) == lay


def test_trial_needs_a_pretraining_benchmark(capsys):
    assert main(["plan", "--model", "gpt-126m", "--system", "device-h100x2", "--trial", "2"]) == 2
    assert "--trial runs the candidates as seeds of a benchmark" in capsys.readouterr().err
