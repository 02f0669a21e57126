"""pass/warn/fail per check, per GPU and per host against the references per GPU model (mlrepro.gpus)."""

from __future__ import annotations

from mlrepro import gpus
from mlrepro.preflight import NA

RANK = {"pass": 0, NA: 0, "warn": 1, "fail": 2}
# Against a figure measured the same way on a healthy GPU of the same model (the power-capped steady
# state, mlrepro.preflight.matmul): >= 85% passes, >= 70% warns. Healthy H200s read 643-676 TFLOP/s
# in any 2 s window of an 8 s load (97-102% of the 660 reference; docs/measurements/multigpu), so a
# healthy GPU clears the pass line by 12 points; a GPU shared with another job read 40%.
MEASURED_PASS, MEASURED_WARN = 0.85, 0.70
# Against a datasheet peak only (torch never reaches it): what a healthy GPU reaches comfortably.
DATASHEET_PASS, DATASHEET_WARN = 0.60, 0.45
# The baseline checklist: all_reduce busbw above 70% of the theoretical link bandwidth; stricter (80% of it)
# where a busbw was measured at that size on the same kind of machine.
BUSBW_THEORY, BUSBW_MEASURED = 0.70, 0.80


def worst(verdicts) -> str:
    verdicts = list(verdicts)
    return max(verdicts, key=RANK.__getitem__) if verdicts else NA


def _grade(value: float, reference: float, measured: bool) -> str:
    hi, lo = (MEASURED_PASS, MEASURED_WARN) if measured else (DATASHEET_PASS, DATASHEET_WARN)
    share = value / reference
    return "pass" if share >= hi else "warn" if share >= lo else "fail"


def judge_gpu(gpu: dict, findings: list[tuple[str, str]]) -> tuple[str, str]:
    """(verdict, why) of one GPU from its matmul and copy figures and its health findings."""
    model = gpus.gpu_model(gpu.get("name"))
    parts = list(findings)
    for key, label, unit, measured, peak in (
        ("matmul_bf16_tflops", "bf16 matmul", "TFLOP/s", model and model.measured_matmul_tflops, model and model.peak_tflops_bf16),
        ("copy_tbps", "copy", "TB/s", model and model.measured_copy_tbps, model and model.hbm_tbps),
    ):
        value = gpu.get(key)
        if value is None:
            continue
        if model is None:
            parts.append(("warn", f"{label} {value:g} {unit}: no reference for {gpu.get('name')!r}"))
            continue
        ref, is_measured = (measured, True) if measured else (peak, False)
        verdict = _grade(value, ref, is_measured)
        kind = "measured reference" if is_measured else "datasheet peak"
        parts.append((verdict, f"{label} {value:g} {unit} = {100 * value / ref:.0f}% of the {kind} {ref:g}"))
    if model and gpu.get("memory_gib") is not None and gpu["memory_gib"] < 0.9 * model.memory_gib:
        parts.append(("fail", f"{gpu['memory_gib']} GiB visible, {model.name} has {model.memory_gib:g} GB"))
    verdict = worst(v for v, _ in parts) if parts else NA
    bad = [w for v, w in parts if v != "pass"] or [w for _, w in parts]
    return verdict, "; ".join(bad)


def judge_peers(rows: list[dict], key: str = "matmul_bf16_tflops") -> None:
    """Each GPU's matmul rate against the fastest GPU of its node (in place: the verdict and why of
    a slower one get worse). Needs no reference, so it also judges a GPU model the table lacks: the
    GPUs of one node share a model, driver and cooling, and healthy ones read within 4% of each
    other under the power cap (two H200s: 653 and 675 TFLOP/s)."""
    rates = [(g, g[key]) for g in rows if isinstance(g.get(key), (int, float)) and g[key] > 0]
    if len(rates) < 2:
        return
    best_gpu, best = max(rates, key=lambda r: r[1])
    for g, value in rates:
        share = value / best
        v = "pass" if share >= MEASURED_PASS else "warn" if share >= MEASURED_WARN else "fail"
        if v == "pass":
            continue
        why = f"bf16 matmul {value:g} TFLOP/s = {100 * share:.0f}% of GPU{best_gpu['index']}'s {best:g} on this node"
        g["why"] = "; ".join(x for x in (g.get("why") if g.get("verdict") != "pass" else "", why) if x)
        g["verdict"] = worst([g.get("verdict", NA), v])


def judge_allreduce(rows: list[dict], gpu_name: str | None, ranks: int, span: str = "nvlink") -> dict:
    """One check of the sweep: busbw against a measured reference at the same size where one exists,
    else its largest busbw against 70% of the link's theoretical bandwidth."""
    name = "allreduce_busbw"
    if not rows:
        return {"name": name, "verdict": NA, "why": "no all_reduce measured (fewer than 2 GPUs)"}
    model = gpus.gpu_model(gpu_name)
    if model is None:
        return {"name": name, "verdict": "warn", "why": f"no reference for {gpu_name!r}"}
    measured = model.measured_busbw_gbs.get(ranks, {})
    by_size = {r["bytes"]: r["busbw_gbps"] for r in rows}
    common = sorted(set(measured) & set(by_size))
    if common:
        size = common[-1]
        share = by_size[size] / measured[size]
        verdict = "pass" if share >= BUSBW_MEASURED else "warn" if share >= BUSBW_THEORY else "fail"
        return {"name": name, "verdict": verdict,
                "why": f"busbw {by_size[size]:g} GB/s at {size >> 20} MiB = {100 * share:.0f}% of the {measured[size]:g} "
                       f"measured on {ranks}x {model.name} (needs {100 * BUSBW_MEASURED:.0f}%)"}
    best = max(rows, key=lambda r: r["busbw_gbps"])
    theory = model.nvlink_gbs
    share = best["busbw_gbps"] / theory
    return {"name": name, "verdict": "pass" if share >= BUSBW_THEORY else "warn",
            "why": f"max busbw {best['busbw_gbps']:g} GB/s at {best['bytes']} B = {100 * share:.0f}% of the "
                   f"theoretical {theory:g} GB/s NVLink (the baseline checklist expects > 70%)"}


def host_verdict(host: dict) -> str:
    return worst([g["verdict"] for g in host["gpus"]] + [c["verdict"] for c in host["checks"]])
