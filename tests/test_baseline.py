"""Baseline probe: the FLOPs formula, the memory model against the measurements recorded on the H100, the report (issue 12)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from mlrepro.baseline import flops, probe, report
from mlrepro.baseline.model import GPT
from mlrepro.plan import models

H100 = Path(__file__).parent / "fixtures" / "preflight" / "h100"
TINY = dataclasses.replace(models.model("gpt-126m"), layers=2, hidden=64, heads=4, kv_heads=4,
                           ffn_hidden=256, vocab=512, seq=128)


def test_megatron_count_matches_torch_flop_counter():
    """The probe's own GPT, counted by PyTorch with attention as plain matmuls (the full s x s
    score matrix): Megatron's count plus the causal half it leaves out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = GPT(TINY)
    x = torch.randint(0, TINY.vocab, (2, TINY.seq))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x, x).backward()
    causal_half = 6 * TINY.hidden * TINY.seq * TINY.layers * 2 * TINY.seq
    assert counter.get_total_flops() == pytest.approx(flops.megatron(TINY, 2) + causal_half, rel=1e-6)


def test_gpt13b_formulas():
    m = models.model("gpt-1.3b")
    h, s, L, V = 2048, 2048, 24, 50304
    assert flops.megatron(m, 1) == pytest.approx(72 * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h)))
    assert flops.megatron(m, 1) / flops.seed003(m, 1) > 4.5  # the seed's formula undercounts


def _recorded_runs() -> list[dict]:
    runs = json.loads((H100 / "debug_probe.json").read_text())
    final = H100 / "baseline.json"
    if final.is_file():
        runs += json.loads(final.read_text())["runs"]
    return [r for r in runs if "error" not in r]


def test_memory_model_within_10pct_of_the_recorded_h100_runs():
    """Every size measured on the H100: plan.memory's prediction for the probe's recipe, now."""
    runs = _recorded_runs()
    assert {r["model"] for r in runs} >= {"gpt-1.3b", "gpt-350m"}
    for r in runs:
        predicted = probe.predicted_gib(models.model(r["model"]), r["mbs"], r["gbs"] // r["mbs"])
        assert abs(predicted - r["peak_mem_gib"]) / r["peak_mem_gib"] < 0.10, (r["model"], r["mbs"], predicted)


def test_report_table_html_markdown_plot(tmp_path):
    doc = {"system": "device-h100", "runs": _recorded_runs(), "flops_formula": "Megatron"}
    report.write(doc, tmp_path / "r.md", tmp_path / "r.html", tmp_path / "r.png")
    md = (tmp_path / "r.md").read_text()
    assert "Achieved TFLOPs (per GPU)" in md and "MFU (% of 989 TFLOP/s)" in md and "gpt-1.3b" in md
    assert "<table" in (tmp_path / "r.html").read_text()
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_report_without_runs_says_why(tmp_path):
    report.write({"system": "local", "runs": [], "why": "not applicable: no CUDA GPU"}, tmp_path / "r.md",
                 tmp_path / "r.html", tmp_path / "r.png")
    assert "not applicable" in (tmp_path / "r.md").read_text()
