"""The typed records (mlrepro.scoring.records) against the files mlrepro wrote before they existed.

tests/fixtures/results_tree_v0 holds run.json, score.json and verdict.json as f5e9645 wrote them (its
SOURCE says how each was made). Every one must read back and be written again byte for byte, and the
scorers of this version must still make the records the older code made from the same logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlrepro.scoring import megatron_score, records
from mlrepro.scoring import score as scoring
from mlrepro.scoring.records import RunRecord, ScoreRecord, VerdictRecord
from mlrepro.scoring.rules import rules_for
import workspace

TREE = workspace.FIXTURES / "results_tree_v0"
READERS = {"run.json": RunRecord, "score.json": ScoreRecord, "verdict.json": VerdictRecord}
FILES = sorted(p for p in TREE.rglob("*.json"))
H100 = "NVIDIA H100 80GB HBM3"


def test_the_fixture_holds_every_record_and_scorer():
    assert {p.name for p in FILES} == set(READERS)
    runs = [RunRecord.read(p) for p in TREE.rglob("run.json")]
    assert {r.scorer for r in runs} == {records.MLLOG, records.OFFICIAL, records.MEGATRON, records.STOPPED}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(TREE)))
def test_a_record_written_before_reads_back_and_writes_the_same_bytes(path, tmp_path):
    record = READERS[path.name].read(path)
    assert record.to_json() == json.loads(path.read_text())
    assert not record.extra  # every key the older code wrote is a field
    record.write(tmp_path / path.name)
    assert (tmp_path / path.name).read_bytes() == path.read_bytes()


def test_each_run_record_says_what_scored_it():
    assert RunRecord.read(TREE / "mini_lora" / "seed_1" / "run.json").scorer == records.MLLOG
    assert RunRecord.read(TREE / "records" / "official" / "run.json").scorer == records.OFFICIAL
    assert RunRecord.read(TREE / "records" / "megatron_band" / "run.json").scorer == records.MEGATRON  # flags too
    stopped = RunRecord.read(TREE / "mini_lora_early_stop" / "seed_2" / "run.json")
    assert stopped.scorer == records.STOPPED and stopped.file is records.ABSENT
    published = ScoreRecord.read(TREE / "published" / "llama2_70b_lora" / "score.json")
    assert {r.scorer for r in published.runs} == {records.OFFICIAL}
    assert {r.scorer for r in ScoreRecord.read(TREE / "mini_lora" / "score.json").runs} == {records.MLLOG}


def test_keys_unknown_or_missing_are_kept_as_they_were():
    old = json.loads((TREE / "mini_lora" / "seed_1" / "run.json").read_text())
    newer = {**old, "written_by_a_newer_version": {"x": 1}}
    assert RunRecord.from_json(newer).to_json() == newer
    older = {k: v for k, v in old.items() if k not in ("fingerprint", "mllog_sha256")}
    assert RunRecord.from_json(older).to_json() == older
    score = json.loads((TREE / "mini_lora" / "score.json").read_text())
    score["runs"][0]["later"] = True
    score["later"] = [1]
    assert ScoreRecord.from_json(score).to_json() == score
    with pytest.raises(ValueError, match="not a JSON object"):
        RunRecord.from_json(["not", "a", "record"])


def _fixture_run(name: str) -> dict:
    return json.loads((TREE / "records" / name / "run.json").read_text())


def test_the_scorers_make_the_records_the_older_code_made(monkeypatch):
    """The same logs, scored by this version, give the fixture's records (their paths are relative to
    the repository, as the older code was given them)."""
    monkeypatch.chdir(workspace.REPO)
    dell = sorted(Path("tests/fixtures/mlperf_v5_sample/Dell/results/9xXE9712x4GB200/llama2_70b_lora")
                  .glob("result_*.txt"))[0]
    official = scoring.run_record(dell, rules_for("llama2_70b_lora"), seed=1)
    assert official.scorer == records.OFFICIAL and official.to_json() == _fixture_run("official")

    sdpa = megatron_score.training_record("tests/fixtures/megatron/megatron_sdpa.log", target_loss=4.0, gpu=H100,
                                          seed=3, benchmark="gpt_126m")
    raised = sdpa.replace(curve=[[i, v * (1.2 if i >= 150 else 1.0)] for i, v in sdpa.curve])
    band = megatron_score.band_checked(raised, "implementations/megatron_gpt/reference/gpt_126m_loss.csv")
    assert band.to_json() == _fixture_run("megatron_band") and band.flags[0].startswith("loss leaves")
    assert sdpa.flags is records.ABSENT and sdpa.loss_band is records.ABSENT  # a new record; sdpa unchanged

    fixture = _fixture_run("megatron_chain_changed")
    chained = megatron_score.training_record("tests/fixtures/megatron/megatron_unfused.log", target_loss=4.0,
                                             seed=2, benchmark="gpt_126m", gpus=1)
    changed = chained.with_segments(fixture["segments"]).changed_after(
        fixture["changed_after_finish"]["reason"], fixture["changed_after_finish"]["rerun"])
    assert changed.to_json() == fixture
    assert chained.with_segments([]) is chained  # a seed run as one job has no segments

    stopped = json.loads((TREE / "mini_lora_early_stop" / "seed_2" / "run.json").read_text())
    assert RunRecord.not_run(2, stopped["reasons"][0]).to_json() == stopped


def test_the_score_of_the_written_runs_is_the_score_written():
    """gpt_126m's score.json of two Megatron logs (`mlrepro score`), scored again from its own runs."""
    written = ScoreRecord.read(TREE / "published" / "gpt_126m" / "score.json")
    rules = rules_for("gpt_126m", target="val_loss<=4.0", required_runs=2)
    # What score_records adds to each run (its duplicate mark, and the reason of a duplicate) taken off again.
    runs = [r.replace(duplicate=records.ABSENT, counted=True, reasons=[]) for r in written.runs]
    assert scoring.score_records(runs, rules).to_json() == written.to_json()
