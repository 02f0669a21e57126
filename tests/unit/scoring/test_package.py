"""mlrepro.scoring.package: submission packages the official package_checker accepts."""

from __future__ import annotations

import json

import pytest

import logs_factory as lf
from mlrepro.scoring import checkers
from mlrepro.scoring.package import PackageError, write_submission_package

DESC = {"number_of_nodes": "1", "accelerators_per_node": "8", "host_processors_per_node": "2",
        "accelerator_model_name": "NVIDIA H100-SXM5-80GB", "framework": "PyTorch"}


def test_package_from_raw_logs_passes_package_checker(tmp_path):
    raw = []
    for i, spec in enumerate(lf.ten_runs()):
        p = tmp_path / "raw" / f"run_{i}.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(lf.srun_text(lf.run_lines(seed=1000 + i, **spec), ranks=2))
        raw.append(p)
    out = tmp_path / "submission"
    info = write_submission_package(out, submitter="mlrepro", system_name="dgx_1x8", system_desc=DESC,
                                    benchmark="llama2_lora", logs=raw, scaling_factor=1.03)
    root = out / "mlrepro"
    assert info["root"] == str(root)
    system = json.loads((root / "systems" / "dgx_1x8.json").read_text())
    assert system["submitter"] == "mlrepro" and system["division"] == "closed"
    results = root / "results" / "dgx_1x8" / "llama2_70b_lora"
    assert sorted(p.name for p in results.glob("result_*.txt")) == sorted(f"result_{i}.txt" for i in range(10))
    assert all(ln.startswith(":::MLLOG ") for ln in (results / "result_0.txt").read_text().splitlines())
    before = sorted(p.name for p in results.iterdir())
    verdict = checkers.run_package_checker(root, ruleset="5.0.0")
    assert verdict.passed, verdict.reasons
    assert sorted(p.name for p in results.iterdir()) == before  # the checker ran on a copy


def test_package_checker_rejects_a_broken_package(tmp_path):
    paths = lf.write_runs(tmp_path / "runs", lf.ten_runs()[:4])  # too few runs
    info = write_submission_package(tmp_path / "sub", submitter="mlrepro", system_name="s", system_desc=DESC,
                                    benchmark="llama2_70b_lora", logs=paths)
    verdict = checkers.run_package_checker(info["root"], ruleset="5.0.0")
    assert verdict.passed is False and any("found 4, expected 10" in r for r in verdict.reasons)


def test_bad_package_inputs(tmp_path):
    good = lf.write_runs(tmp_path / "runs", lf.ten_runs()[:1])
    empty = tmp_path / "empty.log"
    empty.write_text("no mllog here\n")
    cases = [dict(benchmark="mini_lora", logs=good), dict(benchmark="llama2_70b_lora", logs=[]),
             dict(benchmark="llama2_70b_lora", logs=[empty]),
             dict(benchmark="llama2_70b_lora", logs=good, system_desc={"status": "soon"})]
    for case in cases:
        kw = {"system_desc": DESC, **case}
        with pytest.raises(PackageError):
            write_submission_package(tmp_path / "out", submitter="mlrepro", system_name="s", **kw)
