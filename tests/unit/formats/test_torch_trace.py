"""PyTorch profiler traces (issue 35): a step's wall time split into the GPU's busy and waiting time,
kernel time by kind; and whatever bytes it is given, the reader returns that or TraceError."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlrepro.formats import torch_trace
from traces_factory import cpu_trace


def _event(name, cat, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": dur}


def test_a_real_cpu_trace_has_its_steps_and_no_gpu_time(tmp_path):
    summary = torch_trace.summarize_file(cpu_trace(tmp_path / "rank-0.json.gz"))
    assert len(summary["steps"]) == 4 and summary["steps"] == sorted(summary["steps"])
    assert summary["step_s"] > 0 and summary["gpu_busy_s"] == 0 and summary["gpu_idle_s"] == summary["step_s"]
    assert summary["kernel_s"] == {} and summary["kernels_per_step"] == 0
    fewer = torch_trace.summarize_file(tmp_path / "rank-0.json.gz", skip_first=1)
    assert fewer["steps"] == summary["steps"][1:]


def test_busy_time_is_the_union_of_gpu_work_within_the_steps():
    # Two steps of 100 us; kernels overlap (a collective on its own stream) and one copy runs past the end.
    trace = {"traceEvents": [
        _event("ProfilerStep#5", "user_annotation", 0, 100), _event("ProfilerStep#6", "user_annotation", 100, 100),
        _event("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", 10, 30),
        _event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", 30, 20),  # 10 us of it overlaps the GEMM
        _event("pytorch_flash::flash_fwd_kernel", "kernel", 120, 10),
        _event("void at::native::vectorized_elementwise_kernel<4>", "kernel", 140, 10),
        _event("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "kernel", 160, 10),
        _event("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 190, 40),  # 10 us inside the steps
        _event("aten::mm", "cpu_op", 0, 200),  # host work is not GPU work
    ]}
    s = torch_trace.summarize(trace)
    assert s["steps"] == [5, 6]
    assert s["step_s"] == pytest.approx(100e-6)
    assert s["gpu_busy_s"] == pytest.approx((40 + 10 + 10 + 10 + 10) / 2 * 1e-6)
    assert s["gpu_idle_s"] == pytest.approx(s["step_s"] - s["gpu_busy_s"])
    assert s["kernel_s"] == pytest.approx({"gemm": 15e-6, "nccl": 10e-6, "attention": 5e-6, "other": 5e-6,
                                           "optimizer": 5e-6, "copy": 5e-6})
    assert s["kernels_per_step"] == 2.5  # five kernels over two steps


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "other"),
])
def test_kernel_kinds_by_the_libraries_names(name, kind):
    assert torch_trace.kind_of(name) == kind


@pytest.mark.parametrize("data", [b"", b"\x1f\x8b\x08\x00garbage", b"[1, 2]", b'{"traceEvents": 3}', b"\xff" * 64,
                                  b'{"traceEvents": [' + b"[" * 5000])
def test_bytes_that_are_no_trace_are_refused(tmp_path, data):
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(data)
    with pytest.raises(torch_trace.TraceError):
        torch_trace.summarize_file(path)


def test_a_trace_without_profiled_steps_is_refused(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": [_event("gemm", "kernel", 0, 5)]}))
    with pytest.raises(torch_trace.TraceError, match="ProfilerStep"):
        torch_trace.summarize_file(path)


def test_a_decompression_bomb_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(torch_trace, "MAX_BYTES", 1000)
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(gzip.compress(b" " * 10_000))
    with pytest.raises(torch_trace.TraceError, match="larger than"):
        torch_trace.load(path)


numbers = st.one_of(st.integers(-10**400, 10**400), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.none(), st.text(max_size=3))
events = st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "X", "i", 1]),
    "cat": st.sampled_from(["kernel", "gpu_memcpy", "user_annotation", "cpu_op", None, 7]),
    "name": st.one_of(st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#" + "9" * 30,
                                       "nccl", "gemm", "x"]), st.integers()),
    "ts": numbers, "dur": numbers})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=30))
def test_any_events_give_finite_figures_or_trace_error(evs):
    try:
        s = torch_trace.summarize({"traceEvents": evs})
    except torch_trace.TraceError:
        return
    figures = [s["step_s"], s["gpu_busy_s"], s["gpu_idle_s"], *s["kernel_s"].values()]
    assert all(isinstance(x, float) and math.isfinite(x) and x >= 0 for x in figures[:2])
    assert all(math.isfinite(x) for x in figures)
