"""Workload (a) of the baseline (the baseline checklist's): Megatron-LM GPT through the pretraining family's benchmark.

A short run per precision on the system's node, launched the way the benchmark's seeds are
(mlrepro.kinds.megatron): Megatron-LM at the benchmark's pinned commit (or the workflow's
`pretrain: {megatron: <folder or .tar.gz>}`), the planner's torchrun line
(megatron_launch.torchrun_line), executed by the implementation's run_and_time.sh. Data is
Megatron's own synthetic data (--mock-data), so the baseline needs no corpus; validation is off
(--eval-iters 0) and every iteration is logged, so the steady state has enough intervals.

The row (the same keys as the probe's rows, workload "megatron") is read from Megatron's log by
megatron_log/megatron_score: iteration time, samples/s, TFLOP/s per GPU by Megatron's own FLOP
count (baseline.flops.megatron), MFU against the GPU's datasheet peak, and the peak memory torch
allocated next to what the planner's memory model predicts for Megatron's recipe (mlrepro.plan.memory
through workloads.gpt: bf16/fp16 weights, fp32 main gradients, Adam's 12 B sharded by the
distributed optimizer, flash attention's activations with SDPA, materialised scores without).
A system without CUDA GPUs, or fp8 without Transformer Engine, gives a row that says why: no training.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import shutil
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro.gpus import datasheet_peak_tflops
from mlrepro.formats import torch_trace
from mlrepro.baseline import flops
from mlrepro.plan import cost, hardware, memory, models, search, workloads
from mlrepro.plan.layout import Layout
from mlrepro.preflight.run import healthy_record
from mlrepro.kinds.megatron import ensure_megatron
from mlrepro.pretrain import megatron_launch, megatron_plan
from mlrepro.scoring import megatron_log, megatron_score
from mlrepro.util import proc
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger("mlrepro.baseline")

GIB = 2**30
NOT_APPLICABLE = "not applicable"
PROFILED_STEPS = 2  # iterations traced after the timed ones (baseline: megatron: profile)


def model_of(root: Path, benchmark: str) -> str:
    """The planner model the benchmark's `pretrain:` block trains (e.g. gpt-1.3b)."""
    try:
        return next(iter(megatron_plan.variants(mlrepro_config.load_benchmark(root, benchmark)).values())).model
    except megatron_plan.Refused as exc:
        raise mlrepro_config.ConfigError(f"baseline: megatron: benchmark {benchmark}: {exc}") from None


def layout_of(m: dict, gpus_per_node: int) -> Layout:
    """The run's layout: TP and PP as set (1 by default), DP = the node's remaining GPUs unless set."""
    tp, pp = m["tp"], m["pp"]
    dp = m["dp"] or gpus_per_node // (tp * pp)
    if dp < 1 or tp * pp * dp > gpus_per_node:
        raise mlrepro_config.ConfigError(f"baseline: megatron: TP{tp} x PP{pp} x DP{dp} needs more than the "
                                         f"node's {gpus_per_node} GPU(s)")
    if m["gbs"] % (m["mbs"] * dp):
        raise mlrepro_config.ConfigError(f"baseline: megatron: gbs {m['gbs']} is not a multiple of mbs {m['mbs']} "
                                         f"x DP{dp}")
    return Layout(tp=tp, pp=pp, dp=dp, mbs=m["mbs"], ga=m["gbs"] // (m["mbs"] * dp), vpp=m.get("vpp") or 1)


def entries(m: dict) -> list[dict]:
    """The settings of each run: the block's own tp/pp/dp, or each of its `layouts` over them."""
    if not m.get("layouts"):
        return [m]
    # An entry's dp defaults to the node's remaining GPUs, not to the block's dp.
    return [{**m, "dp": None, "vpp": None, **entry} for entry in m["layouts"]]


def check_layouts(m: dict, gpus_per_node: int) -> None:
    """ConfigError naming the first layout the node cannot hold (the planner's is chosen to fit)."""
    for entry in m.get("layouts") or []:
        if entry.get("planner") and set(entry) - {"planner"}:
            raise mlrepro_config.ConfigError(f"baseline: megatron: layouts: {entry}: planner: true takes no other key")
    for entry in entries(m):
        if not entry.get("planner"):
            layout_of(entry, gpus_per_node)


def planner_layout(model: str, gbs: int, attention: str, facts) -> Layout:
    """The layout `mlrepro plan` chooses for the model at this GBS on these GPUs."""
    try:
        return search.plan(workloads.gpt(model, gbs, flash_attention=attention == "sdpa"), facts, top=1).best.layout
    except search.PlanError as exc:
        raise mlrepro_config.ConfigError(f"baseline: megatron: the planner finds no layout: {exc}") from None


def predicted_iter_s(model: str, lay: Layout, attention: str, facts) -> float:
    """The planner's step time for this layout (plan.cost, the figures `mlrepro plan` would use now)."""
    w = workloads.gpt(model, lay.gbs, flash_attention=attention == "sdpa")
    return cost.estimate(w, lay, facts.with_gpus(lay.gpus)).total


def predicted(model: str, lay: Layout, attention: str, vocab: int | None = None,
              fp32_grads: bool = True) -> memory.Memory:
    """The planner's memory model for Megatron's recipe (workloads.gpt, as megatron_plan prices a
    layout), for the vocabulary the run had where it differs from the model's. `fp32_grads`:
    Megatron's accumulate_allreduce_grads_in_fp32, which bf16 forces on; in fp16 it is off by
    default and the gradient buffer has the weights' 2 bytes (2.45 GiB less for GPT-1.3B, as measured)."""
    w = workloads.gpt(model, lay.gbs, flash_attention=attention == "sdpa")
    if vocab and vocab != w.model.vocab:
        w = dataclasses.replace(w, model=dataclasses.replace(w.model, vocab=vocab))
    if not fp32_grads:
        w = dataclasses.replace(w, training=dataclasses.replace(w.training, grad_bytes=2))
    return memory.estimate(w, lay)


def launch_run(model: str, lay: Layout, m: dict, precision: str, profile_dir: Path | None = None) -> megatron_launch.Run:
    """The Megatron run: synthetic data, no validation, every iteration logged. fp8 runs on
    Transformer Engine's layers (the local implementation has no fp8). With `profile_dir`, PROFILED_STEPS
    more iterations after the timed ones, traced by Megatron's PyTorch profiler into
    profile_dir/torch_profile/rank-<r>.json.gz (Megatron writes beside its --tensorboard-dir)."""
    iters = m["iterations"]
    # fp16: Megatron's dynamic loss scale starts at 2^32 and skips an iteration per halving (with
    # hysteresis), which would leave a 20-iteration run mostly skipped steps; 2^16 is where it settles.
    extra = ("--initial-loss-scale", "65536") if precision == "fp16" else ()
    total, tensorboard = iters, ""
    if profile_dir is not None:
        # Megatron records the iterations after --profile-step-start up to --profile-step-end and stops the
        # profiler at the end of iteration --profile-step-end, which must therefore still be trained.
        total = iters + PROFILED_STEPS + 1
        extra += ("--profile", "--use-pytorch-profiler", "--profile-step-start", str(iters + 1),
                  "--profile-step-end", str(total))
        tensorboard = str(Path(profile_dir).resolve() / "events")
    return megatron_launch.Run(model, lay, total, warmup_iters=max(1, iters // 10), log_interval=1,
                               eval_interval=total, eval_iters=0, local_impl=precision != "fp8",
                               sdpa=m["attention"] == "sdpa" and precision != "fp8", precision=precision,
                               tensorboard_dir=tensorboard, extra=extra)


def profile_of(profile_dir: Path) -> dict:
    """The traced steps of each rank (formats.torch_trace): {"rank0": summary, ...}, or why none."""
    traces = sorted(Path(profile_dir).glob("torch_profile/rank-*.json*"))
    if not traces:
        return {"error": f"Megatron wrote no profiler trace under {profile_dir}"}
    out = {}
    for path in traces:
        rank = path.name.split(".")[0].replace("-", "")
        try:
            out[rank] = torch_trace.summarize_file(path)
        except torch_trace.TraceError as exc:
            out[rank] = {"error": str(exc)}
    return out


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def base_row(model: str, precision: str, m: dict) -> dict:
    return {"workload": "megatron", "benchmark": m["benchmark"], "model": model, "precision": precision,
            "attention": m["attention"], "mbs": m["mbs"], "gbs": m["gbs"]}


def why_not(system: mlrepro_config.System, precision: str) -> str | None:
    """Why this precision cannot run on this system (None: it can)."""
    if system.device != "cuda":
        return (f"{NOT_APPLICABLE}: system {system.name} has no CUDA GPUs (device: {system.device}); "
                "Megatron-LM was not started")
    if precision == "fp8" and not has_transformer_engine():
        return f"{NOT_APPLICABLE}: fp8 needs Transformer Engine, which this node's Python lacks"
    return None


def not_applicable_rows(root: Path, system: mlrepro_config.System, b: dict) -> list[dict]:
    """The rows of a system that runs none of the Megatron baseline (what baseline.json shows instead)."""
    m = b["megatron"]
    model = model_of(root, m["benchmark"])
    return [{**base_row(model, p, m), "not_applicable": why_not(system, p)} for p in m["precisions"]]


def row_from_log(log_path: Path, *, model: str, precision: str, lay: Layout, gpu: str | None,
                 attention: str, timed: int | None = None) -> dict:
    """The baseline.json row of one Megatron run, from its log (megatron_log + megatron_score.throughput);
    with `timed`, the iterations after it (the profiled ones, slower for the profiler) are not timed."""
    parsed = megatron_log.parse_log(log_path)
    trained = parsed.iterations[-1] if parsed.iterations else None
    if timed is not None:
        parsed = dataclasses.replace(parsed, iterations=[i for i in parsed.iterations if i.iteration <= timed])
    shape = models.model(model)
    vocab = megatron_score.padded_vocab(parsed, lay.tp)
    if vocab and vocab != shape.vocab:  # a run with its own tokenizer: count and predict what it trained
        shape = dataclasses.replace(shape, vocab=vocab)
    peak = None
    if gpu:
        try:
            peak = datasheet_peak_tflops(gpu)
        except KeyError:
            peak = None
    t = megatron_score.throughput(parsed, gpus=lay.gpus, seq_length=shape.seq, peak_tflops=peak)
    row = {"workload": "megatron", "model": model, "vocab": shape.vocab, "precision": precision, "attention": attention,
           "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "vpp": lay.vpp, "mbs": lay.mbs, "gbs": lay.gbs, "seq": shape.seq,
           "gpu": gpu, "peak_tflops": peak, "log": str(log_path)}
    last = parsed.iterations[-1] if parsed.iterations else None
    if last is None or not t["iter_time_s"]:
        problems = "; ".join(parsed.problems[:3]) if parsed.problems else "see the log"
        return {**row, "error": f"no training iteration in Megatron's log ({problems})"}
    dt = t["iter_time_s"]
    # Megatron's count (flops.megatron); the figure Megatron logged beside it, as a check.
    tflops = flops.megatron(shape, lay.gbs) / dt / lay.gpus / 1e12
    mem = predicted(model, lay, attention, vocab,
                    fp32_grads=parsed.args.get("accumulate_allreduce_grads_in_fp32", "True") == "True")
    pred = mem.total / GIB
    measured = t["max_allocated_gib"] or t["peak_mem_gib"]
    row |= {
        "iter_time_s": round(dt, 4), "samples_per_s": round(lay.gbs / dt, 2),
        "tokens_per_s": round(lay.gbs * shape.seq / dt), "tflops_per_gpu": round(tflops, 1),
        "tflops_logged": t["tflops_per_gpu"], "mfu": round(tflops / peak, 4) if peak else None,
        "peak_mem_gib": round(measured, 2) if measured else None,
        "peak_reserved_gib": round(t["peak_mem_gib"], 2) if t["peak_mem_gib"] else None,
        "predicted_mem_gib": round(pred, 2),
        "mem_error_pct": round(100 * (pred - measured) / measured, 1) if measured else None,
        "predicted_breakdown_gib": {k: round(v * 1e9 / GIB, 2) for k, v in mem.as_gb().items()},
        "iterations": last.iteration, "intervals": t["intervals"],
        "skipped_iterations": sum(i.skipped or 0 for i in parsed.iterations),
        "tflops_narayanan": round(flops.narayanan(shape, lay.gbs) / dt / lay.gpus / 1e12, 1),
    }
    if trained.train_iters is not None and trained.iteration < trained.train_iters:
        row["error"] = f"training stopped at iteration {trained.iteration} of {trained.train_iters}"
    return row


def gpu_name(preflight: dict, system: mlrepro_config.System) -> str | None:
    """The GPU the preflight saw on the node, else the one the system's hardware block names."""
    seen = preflight.get("summary", {}).get("gpu_model")
    if seen and seen != NOT_APPLICABLE:
        return seen
    return (system.hardware or {}).get("gpu")


def run(settings: mlrepro_config.Settings, b: dict, precision: str, preflight_json: Path, out_json: Path,
        megatron_log_path: Path) -> dict | list[dict]:
    """The Megatron baseline run(s) of one precision (or the row saying why not); writes out_json, the row
    or, with `layouts:`, the list of rows (one per layout, run one after the other)."""
    system, root = settings.system, settings.root
    m = b["megatron"]
    model = model_of(root, m["benchmark"])
    why = why_not(system, precision)
    if why:
        row = {**base_row(model, precision, m), "not_applicable": why}
        log.info("megatron %s: %s", precision, why)
        atomic_write_text(megatron_log_path, why + "\n")
        atomic_write_json(out_json, row)
        return row
    pre = healthy_record(Path(preflight_json))
    megatron_dir = ensure_megatron(settings, m["benchmark"])
    # The figures `mlrepro plan` would use now: the datasheet's, with what this preflight measured
    # (None for a system file without them: no prediction, and no planner's layout to run).
    try:
        facts = hardware.from_system(system, root)
    except hardware.HardwareUnknown:
        facts = None
    many = bool(m.get("layouts"))
    rows, failures, logs = [], [], []
    for entry in entries(m):
        if entry.get("planner"):
            if facts is None:
                raise mlrepro_config.ConfigError(f"baseline: megatron: layouts: planner: config/systems/{system.name}.yaml "
                                                 "has no hardware: figures for the planner")
            lay = planner_layout(model, m["gbs"], m["attention"], facts.with_gpus(system.gpus_per_node))
        else:
            lay = layout_of(entry, system.gpus_per_node)
        tag = f".tp{lay.tp}pp{lay.pp}dp{lay.dp}mbs{lay.mbs}" + (f"vpp{lay.vpp}" if lay.vpp > 1 else "") if many else ""
        log_path = megatron_log_path.with_name(megatron_log_path.stem + tag + megatron_log_path.suffix)
        row, failed = one_run(settings, m, model, lay, precision, pre, megatron_dir,
                              out_json.with_name(out_json.stem + tag + ".launch.sh"), log_path)
        row["planner_choice"] = bool(entry.get("planner"))
        if facts is not None:
            row["predicted_iter_time_s"] = round(predicted_iter_s(model, lay, m["attention"], facts), 4)
        if row.get("iter_time_s") and row.get("predicted_iter_time_s"):
            row["iter_time_error_pct"] = round(100 * (row["predicted_iter_time_s"] - row["iter_time_s"])
                                               / row["iter_time_s"], 1)
        if failed:
            failures.append(failed)
            row.setdefault("error", failed)
        rows.append(row)
        logs.append(f"{lay.short()}: {log_path.name}")
    if many:
        atomic_write_text(megatron_log_path, "one Megatron-LM log per layout:\n" + "\n".join(logs) + "\n")
    if failures and (not many or len(failures) == len(rows)):
        # No row file: a rerun runs it again rather than trusting a failed measurement.
        raise RuntimeError(f"Megatron-LM baseline run ({precision}) failed: {'; '.join(failures)}; "
                           f"Megatron's log: {megatron_log_path}")
    result = rows if many else rows[0]
    atomic_write_json(out_json, result)
    return result


def one_run(settings: mlrepro_config.Settings, m: dict, model: str, lay: Layout, precision: str, pre: dict,
            megatron_dir: Path, launch_file: Path, megatron_log_path: Path) -> tuple[dict, str | None]:
    """One Megatron-LM run of the layout under its timeout: (its row, why it failed or None)."""
    system = settings.system
    profile_dir = megatron_log_path.with_suffix(".profile") if m.get("profile") else None
    if profile_dir is not None:
        shutil.rmtree(profile_dir, ignore_errors=True)  # a rerun's traces are its own
    line = megatron_launch.torchrun_line(launch_run(model, lay, m, precision, profile_dir), nproc=lay.gpus)
    atomic_write_text(launch_file, line + "\n")
    megatron_log_path.unlink(missing_ok=True)
    script = settings.benchmark(m["benchmark"]).implementation_dir / "run_and_time.sh"
    env = {"MEGATRON_DIR": str(megatron_dir), "MEGATRON_LAUNCH_FILE": str(launch_file.resolve()),
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    log.info("megatron %s on %s: %s", precision, lay.short(), line)
    failed = None
    # Under timeout: a hung rank (NCCL, a compile) ends the row, not the workflow; --kill-after for a
    # torchrun that ignores SIGTERM.
    limit = int(math.ceil(m["timeout_s"]))
    try:
        proc.run_logged(["timeout", "--kill-after=30", str(limit), "bash", str(script.resolve())], env=env,
                        log_path=megatron_log_path, what="Megatron-LM baseline run")
    except RuntimeError as exc:
        failed = str(exc).splitlines()[0][:300]
    row = row_from_log(megatron_log_path, model=model, precision=precision, lay=lay, gpu=gpu_name(pre, system),
                       attention=m["attention"], timed=m["iterations"] if profile_dir else None)
    row |= {"benchmark": m["benchmark"], "launch": str(launch_file)}
    if profile_dir is not None and not failed:
        row["profile"] = profile_of(profile_dir)
    log.info("megatron %s: %s", precision, json.dumps(row))
    why = "; ".join(x for x in (row.get("error"), failed) if x) or None
    return row, why
