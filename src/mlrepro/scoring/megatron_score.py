"""Score a pretraining run from its Megatron-LM/NeMo training log into the run record MLLOG scoring writes.

The record has scoring.score_run's keys (minutes, status, converged, target_reached,
samples_to_converge, global_batch_size, evals [[samples, loss]], compliance, counted, reasons,
problems) so that the same olympic mean, status and report apply; `minutes` is the time from
the start of training to the first validation at or below the target loss. A `throughput`
block adds the steady-state iteration time, tokens/s, TFLOP/s per GPU (Megatron's own count when
logged, else the planner's model FLOPs) and MFU against the GPU's datasheet peak; `curve` holds
the training loss by iteration for the reference-band check.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

from mlrepro.gpus import datasheet_peak_tflops
from mlrepro.scoring import integrity
from mlrepro.scoring.megatron_log import TrainingLog, parse_log
from mlrepro.scoring.records import MEGATRON, RunRecord

STEADY_SKIP = 2  # log lines left out of the steady state: iteration 1 and the first interval (warm-up, allocation)


def _arg(log: TrainingLog, key: str) -> float | None:
    try:
        return float(log.args[key])
    except (KeyError, ValueError):
        return None


def padded_vocab(log: TrainingLog, tp: int = 1) -> int | None:
    """The vocabulary Megatron trained: --vocab-size padded to make_vocab_size_divisible_by x TP."""
    vocab, step = _arg(log, "vocab_size"), _arg(log, "make_vocab_size_divisible_by") or 128
    if vocab is None:
        return None
    return int(-(-vocab // (step * tp)) * step * tp)


def flops_per_iteration(log: TrainingLog, global_batch_size: float, tp: int = 1) -> float | None:
    """One global batch's FLOPs as Megatron-LM counts them for a dense GPT (training.py's
    num_floating_point_operations: forward and backward, the causal half of the attention scores, the
    padded vocabulary's logits), from the arguments the log prints; None where one is missing. Megatron-LM
    logs its TFLOP/s with it; Megatron-DeepSpeed's TFLOPs count otherwise, so its runs are counted here."""
    L, h, ffn, s, heads = (_arg(log, k) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "seq_length",
                                                  "num_attention_heads"))
    vocab = padded_vocab(log, tp)
    if None in (L, h, ffn, s, heads, vocab):
        return None
    kv_channels = _arg(log, "kv_channels") or h / heads
    groups = (_arg(log, "num_query_groups") if log.args.get("group_query_attention") == "True" else None) or \
        _arg(log, "num_key_value_heads") or heads
    q, kv = kv_channels * heads, kv_channels * groups
    gated = 3 if log.args.get("swiglu") == "True" else 2
    per_token = L * (6 * (h * (q + 2 * kv) + q * h) + 6 * gated * h * ffn + 6 * q * s) + 6 * h * vocab
    return per_token * global_batch_size * s


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def throughput(log: TrainingLog, *, gpus: int | None = None, seq_length: int | None = None,
               peak_tflops: float | None = None, model_flops_per_iter: float | None = None) -> dict[str, Any]:
    """Steady-state speed: medians over the log intervals after the first."""
    steady = log.iterations[STEADY_SKIP:] or log.iterations
    gpus = gpus or int(_arg(log, "world_size") or 1)
    seq = seq_length or _arg(log, "seq_length")
    iter_s = _median(i.iter_ms for i in steady)
    iter_s = iter_s / 1000 if iter_s else None
    gbs = _median(i.global_batch_size for i in steady) or _arg(log, "global_batch_size")
    tflops = _median(i.tflops_per_gpu for i in steady)
    source = "logged" if tflops is not None else None
    if tflops is None and model_flops_per_iter and iter_s:
        tflops, source = model_flops_per_iter / iter_s / gpus / 1e12, "model"
    tokens = gbs * seq / iter_s if gbs and seq and iter_s else None
    peak_mem = log.max_reserved_mb or log.max_allocated_mb
    return {
        "gpus": gpus, "global_batch_size": gbs, "seq_length": seq, "iter_time_s": iter_s,
        "samples_per_s": gbs / iter_s if gbs and iter_s else None, "tokens_per_s": tokens,
        "tokens_per_s_per_gpu": tokens / gpus if tokens else None,
        "tflops_per_gpu": tflops, "tflops_source": source, "peak_tflops": peak_tflops,
        "mfu": tflops / peak_tflops if tflops and peak_tflops else None,
        "peak_mem_gib": peak_mem / 1024 if peak_mem else None,
        "max_allocated_gib": log.max_allocated_mb / 1024 if log.max_allocated_mb else None,
        "intervals": len(steady),
    }


def _samples_at(log: TrainingLog, iteration: int) -> float | None:
    for it in log.iterations:
        if it.iteration == iteration and it.consumed_samples is not None:
            return it.consumed_samples
    gbs = _arg(log, "global_batch_size")
    return iteration * gbs if gbs else None


def score_training_log(path: str | Path, *, target_loss: float, gpu: str | None = None, gpus: int | None = None,
                       seq_length: int | None = None, model_flops_per_iter: float | None = None,
                       seed: int | None = None, benchmark: str | None = None) -> dict[str, Any]:
    """training_record's JSON (run.json's content), for callers that read records as dicts."""
    return training_record(path, target_loss=target_loss, gpu=gpu, gpus=gpus, seq_length=seq_length,
                           model_flops_per_iter=model_flops_per_iter, seed=seed, benchmark=benchmark).to_json()


def training_record(path: str | Path, *, target_loss: float, gpu: str | None = None, gpus: int | None = None,
                    seq_length: int | None = None, model_flops_per_iter: float | None = None,
                    seed: int | None = None, benchmark: str | None = None,
                    log: TrainingLog | None = None) -> RunRecord:
    """The run record of one pretraining log (`log`: already parsed, by a dialect's own parser). Never
    raises on bad log content."""
    log = log or parse_log(path)
    reasons: list[str] = []
    peak = None
    if gpu:
        try:
            peak = datasheet_peak_tflops(gpu)
        except KeyError as exc:
            reasons.append(str(exc))
    last = log.iterations[-1] if log.iterations else None
    finished = last is not None and last.train_iters is not None and last.iteration >= last.train_iters
    status = "success" if finished else ("aborted" if last is not None else None)
    if log.source == "none":
        reasons.append("no Megatron-LM or NeMo training lines in the log")
    elif not finished:
        reasons.append(f"training stopped at iteration {last.iteration} of {last.train_iters or '?'}")
    order = integrity.training_log_problems(log)
    doubtful = integrity.validation_problems(log)
    reasons += order + doubtful
    evals = [[_samples_at(log, v.iteration), v.loss] for v in log.validations]
    # A loss no language model can have (<= 0) reaches no target.
    hit = next((v for v in log.validations if 0 < v.loss <= target_loss), None)
    minutes = None
    if hit is not None and hit.time is not None and log.start is not None and not order:
        minutes = (hit.time - log.start).total_seconds() / 60
        if minutes <= 0:
            reasons.append(f"validation at iteration {hit.iteration} is stamped {-minutes:.3f} min before the "
                           f"start of training; not scored")
            minutes = None
    if not log.validations:
        reasons.append("no validation loss logged")
    elif hit is None:
        reasons.append(f"target validation loss <= {target_loss:g} not reached "
                       f"(best {min(v.loss for v in log.validations):g})")
    elif minutes is None and not order:
        reasons.append("no time to train: the log has no '[before the start of training step]' stamp or no "
                       "stamped iteration before the target validation")
    seed = seed if seed is not None else (int(_arg(log, "seed")) if _arg(log, "seed") is not None else None)
    return RunRecord(
        scorer=MEGATRON, file=str(path), seed=seed, benchmark=benchmark, source=log.source,
        minutes=minutes, status=status, target_reached=hit is not None,
        # A log out of order or with a loss no model has is not a run that converged, whatever it reached.
        converged=status == "success" and hit is not None and minutes is not None and not (order or doubtful),
        samples_to_converge=_samples_at(log, hit.iteration) if hit is not None else None,
        iteration_to_converge=hit.iteration if hit is not None else None,
        global_batch_size=_arg(log, "global_batch_size"), evals=evals,
        compliance={"checked": False, "pass": None, "reasons": ["not an MLPerf log: no compliance check"]},
        counted=not reasons, reasons=reasons, problems=list(log.problems), mllog_sha256=None,
        throughput=throughput(log, gpus=gpus, seq_length=seq_length, peak_tflops=peak,
                              model_flops_per_iter=model_flops_per_iter),
        curve=[[i.iteration, i.lm_loss] for i in log.iterations if i.lm_loss is not None],
        fingerprint=integrity.training_fingerprint(log))


def band_checked(record: RunRecord, reference: str | Path, tolerance: float | None = None,
                 plot_to: str | Path | None = None) -> RunRecord:
    """The record with its `loss_band` (and a flag naming the step where the loss leaves the band)."""
    # pandas and matplotlib: loaded by the runs that check a band, not by every scorer's import.
    from mlrepro.scoring import loss_band

    band = loss_band.load_reference(reference, tolerance)
    result = loss_band.check(record.curve, band)
    checked = {**dataclasses.asdict(result), "reference": str(reference), "message": result.message()}
    if plot_to is not None:
        loss_band.plot(record.curve, band, result, plot_to, title=Path(record.file).name)
        checked["plot"] = str(plot_to)
    return record.with_loss_band(checked, None if result.inside else result.message())


def check_reference(record: dict, reference: str | Path, tolerance: float | None = None,
                    plot_to: str | Path | None = None) -> dict:
    """band_checked on a run record read as a dict: the dict is given its `loss_band` (and `flags`)."""
    checked = band_checked(RunRecord.of(record), reference, tolerance, plot_to).to_json()
    record.update({k: checked[k] for k in ("loss_band", "flags") if k in checked})
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlrepro.scoring.megatron_score", description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--target-loss", type=float, required=True, help="validation loss that counts as converged")
    parser.add_argument("--gpu", help="GPU name (e.g. 'NVIDIA H100 80GB HBM3') for MFU against its datasheet peak")
    parser.add_argument("--gpus", type=int, help="GPUs of the run (default: the log's world_size)")
    parser.add_argument("--reference", help="reference loss curve CSV (iteration,loss[,lower,upper])")
    parser.add_argument("--tolerance", type=float, help="relative band when the reference has no lower/upper")
    parser.add_argument("--plot", help="write the loss-vs-band plot here (.png or .svg)")
    parser.add_argument("--out", help="write the run record (JSON) here")
    args = parser.parse_args(argv)
    record = training_record(args.log, target_loss=args.target_loss, gpu=args.gpu, gpus=args.gpus)
    if args.reference:
        record = band_checked(record, args.reference, args.tolerance, args.plot)
    if args.out:
        record.write(args.out)
    t = record.throughput
    fmt = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731
    print(f"{record.file}: {record.status}, target reached: {record.target_reached}, "
          f"minutes to target: {fmt(record.minutes, '.2f')}; {fmt(t['tokens_per_s'], ',.0f')} tokens/s, "
          f"{fmt(t['tflops_per_gpu'], '.1f')} TFLOP/s/GPU, MFU {fmt(t['mfu'], '.1%')}, "
          f"peak memory {fmt(t['peak_mem_gib'], '.1f')} GiB")
    for flag in record.flags or []:
        print("FLAG:", flag)
    return 0 if record.counted else 1


if __name__ == "__main__":
    sys.exit(main())
