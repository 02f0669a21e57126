"""The planner calibrated on the node (issue 35): the measured rates it prices each operation at,
the constants fitted on the recorded 2x H200 steps (tests/fixtures/planner/h200x2), what it keeps
of every finished run, and Megatron's overlapped DP reduce on the launch line."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlrepro import paths
from mlrepro.formats import torch_trace
from mlrepro.plan import calibration, cost, hardware, models, search, workloads
from mlrepro.plan.layout import Layout
from mlrepro.preflight import gemm
from mlrepro.pretrain import megatron_launch

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "tests" / "fixtures" / "planner" / "h200x2"
SYSTEM = "device-h200x2"
DP2 = Layout(dp=2, mbs=4, ga=2)
TP2 = Layout(tp=2, mbs=4, ga=4)
PP2 = Layout(pp=2, vpp=4, mbs=1, ga=16)


@pytest.fixture
def root(tmp_path) -> Path:
    """A checkout whose results/ hold the recorded preflight and baseline of the 2x H200 node."""
    for name in ("config", "workflow"):
        (tmp_path / name).symlink_to(ROOT / name)
    for stage in ("preflight", "baseline"):
        folder = tmp_path / "results" / stage / SYSTEM
        folder.mkdir(parents=True)
        shutil.copy(RECORDED / f"{stage}.json", folder / f"{stage}.json")
    return tmp_path


def step(facts, lay: Layout, model: str = "gpt-1.3b") -> float:
    return cost.estimate(workloads.gpt(model, lay.gbs), lay, facts.with_gpus(lay.gpus)).total


# ---------------------------------------------------------------- what the node measured, by size


def test_the_gemm_sweep_measures_the_shapes_the_planner_prices():
    for name, (h, ffn, vocab) in gemm.MODELS.items():
        shape = models.model(name)
        assert (shape.hidden, shape.ffn_hidden, shape.vocab, shape.seq) == (h, ffn, vocab, gemm.SEQ)
    swept = {(s["m"], s["n"], s["k"]) for s in gemm.shapes()}
    for name in gemm.MODELS:
        for mbs in gemm.MBS:
            for tp in gemm.TP:
                lay = Layout(tp=tp, mbs=mbs)
                for _, m, n, k, _ in cost.gemm_shapes(workloads.gpt(name, mbs), lay):
                    assert (m, n, k) in swept, (name, mbs, tp, m, n, k)


def test_without_cuda_the_sweep_says_why_and_the_plan_says_default():
    record = gemm.sweep()
    assert record["rows"] == [] and record["skipped"].startswith("skipped: ")
    facts = hardware.with_measured(hardware.load(ROOT, SYSTEM, measured=False),
                                   {"hosts": [], "summary": {}, "gemm": record}, None)
    figures = {f["figure"]: f for f in facts.figures()}
    assert figures["gemm_rates"]["value"] == "default" and "no GEMM sweep" in figures["gemm_rates"]["source"]


def test_tp_messages_are_priced_at_the_bandwidth_of_their_size():
    """GPT-1.3B's TP all-reduce is 32 MiB per MBS4 micro-batch: 231 GB/s on the node's sweep, not the
    343 GB/s plateau the system file gives."""
    plain = hardware.load(ROOT, SYSTEM, measured=False)
    measured = hardware.with_measured(plain, json.loads((RECORDED / "preflight.json").read_text()), None)
    assert measured.curves.busbw_gbs(32 * 2 ** 20) == pytest.approx(231.3, abs=0.1)
    w = workloads.gpt("gpt-1.3b", 16)
    before = cost.microbatch(w, TP2, plain.with_gpus(2)).tp_comm
    after = cost.microbatch(w, TP2, measured.with_gpus(2)).tp_comm
    assert after > before * 1.1 and after == pytest.approx(24 * 4 * 32 * 2 ** 20 / 231.3e9, rel=0.02)


def test_a_sweep_prices_each_gemm_at_its_shape():
    """A node whose small GEMMs are slow: per sample, MBS1 costs more than MBS4 (issue 35: the model
    priced a micro-batch of 1 like one of 4)."""
    plain = hardware.load(ROOT, SYSTEM, measured=False).with_gpus(1)
    rows = [{"m": 2048 * b, "n": n, "k": k, "tflops": rate}
            for b, rate in ((1, 400.0), (4, 600.0)) for n, k in ((6144, 2048), (2048, 2048), (8192, 2048),
                                                                  (2048, 8192), (50304, 2048))]
    swept = hardware.with_measured(plain, {"hosts": [], "summary": {}, "gemm": {"rows": rows}}, None)
    assert hardware.basis(swept) == "sweep" and swept.curves.gemm_tflops(2048, 6144, 2048) == 400.0
    w = workloads.gpt("gpt-1.3b", 16)
    one, four = (cost.microbatch(w, Layout(mbs=b), swept).compute / b for b in (1, 4))
    assert one > 1.3 * four
    # without a sweep the default curve still makes a micro-batch of 1 dearer, but mildly
    one, four = (cost.microbatch(w, Layout(mbs=b), plain).compute / b for b in (1, 4))
    assert 1.0 < one / four < 1.1


# ---------------------------------------------------------------- calibration on the recorded rows


def test_calibration_on_the_recorded_h200x2_rows(root):
    before = hardware.load(root, SYSTEM)
    assert before.tuning is None
    # issue 35's picture: PP2 VPP4 MBS1 predicted as fast as DP2 though it measured 2.3x slower
    assert step(before, PP2) < 0.45 * 0.806
    record = calibration.calibrate_system(root, SYSTEM)
    written = json.loads(paths.calibration_json(root, SYSTEM).read_text())
    assert written == json.loads(json.dumps(record))
    assert [r["row"] for r in written["rows"]] == ["gpt-1.3b TP1 PP1 DP2 MBS4 GBS16", "gpt-1.3b TP2 PP1 DP1 MBS4 GBS16",
                                                   "gpt-1.3b TP1 PP2 DP1 VPP4 MBS1 GBS16"]
    assert all(abs(r["after_error_pct"]) <= 15 for r in written["rows"])
    assert max(abs(r["before_error_pct"]) for r in written["rows"]) > 50
    assert all(r["leave_one_out_error_pct"] is not None for r in written["rows"])
    assert written["free"] == ["compute_scale", "chunk_overhead_s"]  # three rows: two constants, no more
    after = hardware.load(root, SYSTEM)
    assert after.tuning.chunk_overhead_s > 0.001 and after.tuning.basis == "mfu"
    sources = {f["figure"]: f["source"] for f in after.figures()}
    assert sources["chunk_overhead_s"].startswith("fitted on 3 measured steps")
    assert sources["elementwise_passes"].startswith("default (")  # the rows cannot tell it apart: named
    # the planner's first choice is now the fastest measured layout, and PP2 VPP4 MBS1 is priced slow
    best = search.plan(workloads.gpt("gpt-1.3b", 16), after.with_gpus(2), top=10)
    assert (best.layout.tp, best.layout.pp, best.layout.dp) == (1, 1, 2)
    assert step(after, PP2) > 2 * step(after, DP2)


def test_mlrepro_plan_uses_the_calibration(root, capsys):
    from mlrepro.cli import main

    calibration.calibrate_system(root, SYSTEM)
    assert main(["plan", "--model", "gpt-1.3b", "--gbs", "16", "--system", SYSTEM, "--root", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["best"]["tp"], out["best"]["pp"], out["best"]["dp"]) == (1, 1, 2)
    figures = {f["figure"]: f["source"] for f in out["figures"]}
    assert figures["compute_scale"].startswith("fitted on 3 measured steps")
    assert figures["allreduce_by_size"].startswith("preflight all_reduce sweep")


def test_a_finished_run_is_kept_and_the_next_plan_starts_from_it(root):
    """Learn from every run: a seed's measured step joins the baseline rows in the fit."""
    slow = calibration.Observation(model="gpt-1.3b", layout=Layout(dp=2, mbs=2, ga=4), measured_s=0.5,
                                   source="seed gpt_1p3b/1", predicted_s=0.33)
    calibration.observe(root, SYSTEM, slow)
    calibration.observe(root, SYSTEM, slow)  # the same seed again: kept once
    kept = json.loads(paths.observed_json(root, SYSTEM).read_text())["rows"]
    assert kept == [slow.to_json()]
    record = json.loads(paths.calibration_json(root, SYSTEM).read_text())
    assert record["rows"][-1]["row"] == "gpt-1.3b TP1 PP1 DP2 MBS2 GBS16" and record["rows"][-1]["measured_s"] == 0.5
    assert "step_overhead_s" not in record["free"] and len(record["rows"]) == 4


def test_the_calibration_benchmark_prints_before_and_after():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "planner_calibration.py")], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "| gpt-1.3b TP1 PP2 DP1 VPP4 MBS1 GBS16 | 0.806 |" in proc.stdout
    assert "| gpt-1.3b | 16 | TP1 PP1 CP1 DP2 MBS4 GA2 (GBS 16) | 0.344 |" in proc.stdout and "| yes |" in proc.stdout


def test_calibrated_on_the_2xh200_sweep_every_workloads_first_choice_is_within_5pct_of_its_fastest():
    """Issue 35's acceptance on the recorded sweep (docs/measurements/planner/h200x2_sweep: 23 Megatron-LM layouts of
    GPT-1.3B at GBS 16 and 64 and GPT-126M at GBS 16, the GEMM/SDPA shapes, the preflight): before calibration the
    model misses MBS1 and PP by 40-80%; after it, all but two rows within 15% (the other two within 25%), and the
    planner's first choice of each workload measured within 5% of the fastest layout."""
    sweep = ROOT / "docs" / "measurements" / "planner" / "h200x2_sweep"
    baseline = json.loads((sweep / "baseline.json").read_text())
    preflight = {**json.loads((sweep / "preflight.json").read_text()),
                 "gemm": json.loads((sweep / "gemm_sweep.json").read_text())}
    facts = hardware.with_measured(hardware.load(ROOT, SYSTEM, measured=False), preflight, baseline).with_tuning(None)
    rows = calibration.baseline_observations(baseline, "sweep")
    assert len(rows) == 23
    # the fit alone (calibrate's leave-one-out refits 23 times; benchmarks/planner_calibration.py records those)
    assert "launch_per_layer_s" in calibration.free_constants(rows)
    tuning = calibration.fit(rows, facts, source="sweep")
    assert tuning.launch_per_layer_s > 0.001
    tuned = facts.with_tuning(tuning)
    before = [abs(calibration.error_pct(calibration.predict(o, facts), o.measured_s)) for o in rows]
    after = [abs(calibration.error_pct(calibration.predict(o, tuned), o.measured_s)) for o in rows]
    assert max(before) > 50 and max(after) < 25
    assert sum(e <= 15 for e in after) >= 21
    for (model, gbs) in (("gpt-1.3b", 16), ("gpt-1.3b", 64), ("gpt-126m", 16)):
        group = [o for o in rows if o.model == model and o.layout.gbs == gbs]
        best = search.plan(workloads.gpt(model, gbs), tuned.with_gpus(2), top=1).layout
        chosen = [o for o in group if (o.layout.tp, o.layout.pp, o.layout.vpp, o.layout.mbs)
                  == (best.tp, best.pp, best.vpp, best.mbs)]
        assert chosen, f"{model} GBS {gbs}: the first choice {best.short()} was not measured"
        assert chosen[0].measured_s <= 1.05 * min(o.measured_s for o in group), (model, gbs, best.short())


# ---------------------------------------------------------------- data parallelism that scales


def test_dp_reduce_overlaps_with_the_backward_on_the_launch_line_and_in_the_price():
    def args(lay, **kw):
        return megatron_launch.pretrain_args(megatron_launch.Run("gpt-126m", lay, 10, **kw))

    assert "--overlap-grad-reduce" not in args(Layout(mbs=8, ga=2))
    dp2 = args(Layout(dp=2, mbs=8, ga=1))
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--use-distributed-optimizer"} <= set(dp2)
    resumable = args(Layout(dp=2, mbs=8, ga=1), save="/ckpt", save_interval=5)
    assert "--overlap-grad-reduce" in resumable and "--overlap-param-gather" not in resumable
    facts = hardware.load(ROOT, SYSTEM, measured=False).with_gpus(2)
    w = workloads.gpt("gpt-1.3b", 16)
    exposed = cost.microbatch(w, DP2, facts).dp_comm
    whole = cost.microbatch(dataclasses.replace(w, training=dataclasses.replace(w.training, overlap_grad_reduce=False)),
                            DP2, facts).dp_comm
    assert 0 < exposed < 0.5 * whole


# ---------------------------------------------------------------- traced steps (baseline: megatron: profile)

TRACED = ROOT / "docs" / "measurements" / "planner" / "h200_profile"
TRACE = ROOT / "tests" / "fixtures" / "planner" / "h200_gpt126m_mbs8_trace.json.gz"


def traced_facts_and_rows():
    """The 1-GPU H200's traced baseline rows (GPT-126M MBS 1/2/4/8, GPT-1.3B MBS 4/8) and its measured facts."""
    baselines = [json.loads((TRACED / f).read_text()) for f in ("gpt126m_baseline.json", "gpt1p3b_baseline.json")]
    preflight = {**json.loads((TRACED / "preflight.json").read_text()),
                 "gemm": json.loads((ROOT / "docs/measurements/planner/h200x2_sweep/gemm_sweep.json").read_text())}
    merged = {"runs": [r for b in baselines for r in b["runs"]]}
    facts = hardware.with_measured(hardware.load(ROOT, "device-h200", measured=False), preflight, merged)
    return facts.with_tuning(None), calibration.baseline_observations(merged, "traced")


@pytest.mark.parametrize("profile, busy", [
    ({"rank0": {"gpu_busy_s": 0.106}}, 0.106),
    ({"rank0": {"error": "not a trace"}}, None),
    ({"rank0": {"gpu_busy_s": "fast"}}, None),
    ({"rank0": {"gpu_busy_s": -1}}, None),
    ({"rank0": {"gpu_busy_s": float("nan")}}, None),
    ({"error": "Megatron wrote no profiler trace"}, None),
])
def test_a_traced_row_carries_the_gpus_busy_time(profile, busy):
    row = {"model": "gpt-126m", "tp": 1, "pp": 1, "dp": 1, "mbs": 8, "gbs": 16, "iter_time_s": 0.132,
           "profile": profile}
    obs = calibration.Observation.from_row(row, "b")
    assert obs.gpu_busy_s == busy and obs.measured_s == 0.132
    assert calibration.Observation.from_row(obs.to_json(), "observed").gpu_busy_s == busy


def test_the_loss_term_is_what_the_h200_trace_measures():
    """LOSS_FP32_PASSES against the kernels a real step ran: GPT-126M at MBS 8 on one H200, two micro-batches."""
    trace = torch_trace.load(TRACE)
    summary = torch_trace.summarize(trace)
    micro_batches, tokens, vocab = 2, 8 * 2048, models.model("gpt-126m").vocab
    kernels = torch_trace.top_kernels(trace, 10_000)
    # The loss's kernels: element-wise, a few launches a micro-batch, each over tokens x vocabulary (> 0.3 ms).
    loss = [k for k in kernels if k["kind"] == "other" and k["launches"] <= 3 * micro_batches
            and k["s"] / k["launches"] > 3e-4]
    copy = json.loads((TRACED / "preflight.json").read_text())["hosts"][0]["gpus"][0]["copy_tbps"] * 1e12
    passes = sum(k["s"] for k in loss) / micro_batches * copy / (tokens * vocab * 4)
    assert cost.LOSS_FP32_PASSES == pytest.approx(passes, rel=0.15)
    # GPT-126M's element-wise work outweighs its GEMMs and attention together: what an MFU-only model misses.
    kinds = summary["kernel_s"]
    assert kinds["other"] > kinds["gemm"] + kinds["attention"]
    assert summary["gpu_busy_s"] == pytest.approx(sum(kinds.values()), rel=0.03)  # one stream: little overlap


def test_traces_tell_the_gpus_terms_from_the_hosts():
    facts, rows = traced_facts_and_rows()
    assert len(rows) == 6 and all(o.gpu_busy_s for o in rows)
    stripped = [dataclasses.replace(o, gpu_busy_s=None) for o in rows]
    # Step times of one GPU alone cannot tell the element-wise passes from the GEMMs' rate (that took TP rows);
    # the busy times can.
    assert calibration.free_constants(stripped) == ["compute_scale", "launch_per_layer_s", "step_overhead_s"]
    assert calibration.free_constants(rows) == ["compute_scale", "launch_per_layer_s", "elementwise_passes",
                                                "step_overhead_s"]
    with_traces = facts.with_tuning(calibration.fit(rows, facts))
    without = facts.with_tuning(calibration.fit(stripped, facts))
    for o in rows:
        assert calibration.step(o, with_traces).gpu_busy == pytest.approx(o.gpu_busy_s, rel=0.06), o.label()
    assert max(abs(calibration.step(o, without).gpu_busy / o.gpu_busy_s - 1) for o in rows) > 0.10
    # ... and the step times stay fitted (the busy times are a constraint more, not a trade against them).
    assert max(abs(calibration.error_pct(calibration.predict(o, with_traces), o.measured_s)) for o in rows) < 15
    # GPT-126M at MBS 1: the GPU works about a quarter of the step; the host's launches are the rest.
    mbs1 = next(o for o in rows if o.model == "gpt-126m" and o.layout.mbs == 1)
    assert mbs1.gpu_busy_s < 0.3 * mbs1.measured_s
    assert calibration.step(mbs1, with_traces).gpu_busy < 0.3 * calibration.predict(mbs1, with_traces)


def test_the_tp_replicated_share_of_element_wise_work_is_what_one_tp2_ranks_shapes_measured():
    """GPT-126M at TP1 with one TP2 rank's shapes against the whole model, both at MBS 8 on one H200
    (h200_profile/halftp): the element-wise kernel time outside the loss that a TP2 rank keeps."""
    summaries = [json.loads(line.split(": ", 1)[1]) for line in (TRACED / "halftp" / "top_kernels.txt").read_text().splitlines()
                 if ".json.gz: {" in line]
    half, whole = summaries[1]["kernel_s"]["other"], summaries[2]["kernel_s"]["other"]  # half_mbs8, whole_mbs8
    copy = json.loads((TRACED / "preflight.json").read_text())["hosts"][0]["gpus"][0]["copy_tbps"] * 1e12
    tokens, micro_batches = 8 * 2048, 2

    def loss(vocab):
        return cost.LOSS_FP32_PASSES * tokens * vocab * 4 / copy * micro_batches
    kept = (half - loss(25_216)) / (whole - loss(50_304))
    assert cost.TP_REPLICATED_ELEMENTWISE == pytest.approx(2 * kept - 1, abs=0.03)
    # The model: at TP2 without sequence parallelism a rank keeps that share and half the rest; with it, half.
    facts = hardware.load(ROOT, SYSTEM, measured=False).with_tuning(
        cost.Tuning(compute_scale=1.0, elementwise_passes=100.0, source="test", basis="mfu"))
    w = workloads.gpt("gpt-126m", 16)

    def element_wise(lay):
        with_passes = cost.microbatch(w, lay, facts).compute
        without = cost.microbatch(w, lay, facts.with_tuning(dataclasses.replace(facts.tuning, elementwise_passes=0.0))).compute
        return with_passes - without
    tp1, tp2 = element_wise(Layout(mbs=8)), element_wise(Layout(tp=2, mbs=8))
    assert tp2 == pytest.approx(tp1 * (cost.TP_REPLICATED_ELEMENTWISE + (1 - cost.TP_REPLICATED_ELEMENTWISE) / 2))
    assert element_wise(Layout(tp=2, mbs=8, sp=True)) == pytest.approx(tp1 / 2)
