"""The Megatron-DeepSpeed kind for real on CPU, through the real snakemake: deepspeedai/Megatron-DeepSpeed at the
pinned commit (tests/fixtures/megatron_deepspeed/source_4efb479.tar.gz) patched by implementations/
megatron_deepspeed/patches and packed as device/deepspeed_carry.sh packs it, DeepSpeed 0.19.8 (pyproject's
`deepspeed` extra, which `make install` builds without ops) on its CPU accelerator and gloo, a miniature GPT
(gpt-mini) on the miniature corpus: one seed to a score, and a seed chained over two jobs by the fork's own
1-minute clock that resumes from DeepSpeed's checkpoint."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import statistics
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from mlrepro.pretrain import megatron_deepspeed as mds
from mlrepro.scoring import tfevents
from workspace import FIXTURES, REPO, make_workspace, run_snakemake

pytestmark = pytest.mark.slow

BENCH = "gpt_mini_deepspeed"
CHAIN = "gpt_mini_deepspeed_chain"
SCORE_ITERS = 200  # enough iterations to time one (about 25 ms on two cores) for the chain's sizing
# The chain: a job limit of 100 s less a 30 s margin is the fork's 1-minute clock (--exit-duration-in-mins 1),
# counted from its start (about 8 s of it go to starting: 52 s of training measured on two idle cores). The seed is
# sized to CHAIN_SECONDS of training at the first test's median speed: two jobs at that speed, still two or more
# if the chain runs up to 1.6 times faster, three or more if something beside it slows it by a fifth or more.
CHAIN_SECONDS = 85
TARGET = 4.25


def benchmark(name: str, **keys) -> dict:
    """gpt_126m_deepspeed as shipped, on gpt-mini: its fork pin, DeepSpeed pin, target and corpus."""
    spec = yaml.safe_load((REPO / "config/benchmarks/gpt_126m_deepspeed.yaml").read_text())
    spec.update(name=name, description="Megatron-DeepSpeed on a miniature GPT, on CPU (tests).", **keys)
    # gpt-mini's validation loss is about 4.4 after 100 iterations and 4.1 after 200 (SCORE_ITERS)
    spec["target"] = {"metric": "val_loss", "value": TARGET, "direction": "below"}
    spec["pretrain"].update(model="gpt-mini", tokens=1_000_000, gbs=4, layouts=[
        {"name": "gpt-mini", "tp": 1, "pp": 1, "dp": 1}, {"name": "gpt-mini-2xdp", "tp": 1, "pp": 1, "dp": 2}])
    return spec


def configfile(ws: Path, name: str, benchmarks: list[str], **pretrain) -> str:
    path = ws / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"benchmarks": benchmarks, "corpora": ["mini_corpus"], "pretrain": {
        "layout": "gpt-mini", "gbs": 4, "mbs": 2, "megatron": str(ws.parent / "megatron-deepspeed.tar.gz"),
        "walltime_minutes": 4, **pretrain}}))
    return path.name


def cpu_env(gpus: int = 1) -> dict[str, str]:
    # The local backend checks the layout's GPU count against CUDA_VISIBLE_DEVICES; torch sees no CUDA either way
    # (the CPU wheel) and DeepSpeed picks its CPU accelerator. torchrun is the venv's.
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def iterations(log: str) -> list[int]:
    """The iterations the fork's log reports (training_log's ` iteration N/ M |`)."""
    return [int(n) for n in re.findall(r"^\s*iteration\s+(\d+)/\s*\d+ \|", log, flags=re.M)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is not installed: `make install` installs pyproject's `deepspeed` extra")
    top = tmp_path_factory.mktemp("ds_cpu")
    # The patched tarball as device/deepspeed_carry.sh makes it: the pinned source, apply_patches, pack.
    src = top / "src"
    with tarfile.open(FIXTURES / "megatron_deepspeed" / "source_4efb479.tar.gz") as tar:
        tar.extractall(src)
    applied = mds.apply_patches(REPO, src)
    (src / "mlrepro_patches.json").write_text(
        json.dumps({"commit": "4efb479d5317ce9b86096b9d8e3e8030b0b5263b", "patches": applied}) + "\n")
    mds.pack(src, top / "megatron-deepspeed.tar.gz")
    ws = make_workspace(top / "ws")
    (ws / f"config/benchmarks/{BENCH}.yaml").write_text(yaml.safe_dump(benchmark(BENCH)))
    return ws


@pytest.fixture(scope="module")
def scored(ws):
    started = time.monotonic()
    run_snakemake(ws, "-c2", f"results/{BENCH}/score.json", "--configfile",
                  configfile(ws, "one", [BENCH], train_iters=SCORE_ITERS), "--config", "system=device-h200",
                  env=cpu_env(), timeout=600)
    return {"seconds": time.monotonic() - started}


def flag(line: list[str], name: str) -> str:
    return line[line.index(name) + 1]


def test_one_seed_trains_on_cpu_to_a_score(ws, scored):
    seed = ws / f"results/{BENCH}/seed_1"
    run = json.loads((seed / "run.json").read_text())
    print(f"{BENCH} on CPU: {scored['seconds']:.0f} s from nothing (corpus stages, source, seed, score); "
          f"{run['throughput']['iter_time_s'] * 1000:.1f} ms an iteration; evals {run['evals']}")
    assert json.loads((ws / f"results/{BENCH}/score.json").read_text())
    assert run["status"] == "success" and run["problems"] == [], run
    assert json.loads((seed / "finished.json").read_text())["file"] == "mllog.txt"
    # The curve (every --log-interval 10) and the evaluations (every 100 iterations, 400 samples) come from the
    # fork's log: the loss falls from the initial one to the target, reached at the last evaluation.
    curve, evals = run["curve"], run["evals"]
    assert [int(c[0]) for c in curve] == list(range(10, SCORE_ITERS + 1, 10)), curve
    assert curve[0][1] > 6 and curve[-1][1] < curve[0][1] - 1.5
    assert [int(n) for n, _ in evals] == [400, 800], evals
    assert evals[0][1] > TARGET >= evals[-1][1]
    assert run["converged"] and run["samples_to_converge"] == 800 and run["minutes"] > 0
    assert run["throughput"]["gpus"] == 1 and run["throughput"]["seq_length"] == 128
    # The fork wrote TensorBoard events into the seed's tensorboard/, read for the score, and the scored curve is
    # written to results/tensorboard/<benchmark>/seed_1.
    assert tfevents.event_files(seed / "tensorboard"), list((seed / "tensorboard").iterdir())
    written = tfevents.read_scalars(ws / f"results/tensorboard/{BENCH}/seed_1")
    assert written.series and written.skipped == [], written
    # ds_config.json agrees with the line that ran: the batch sizes, ZeRO stage 1, bf16 and the config's path.
    ds = json.loads((seed / "ds_config.json").read_text())
    line = shlex.split((seed / "launch.sh").read_text().strip().splitlines()[-1])
    assert line[:3] == ["torchrun", "--standalone", "--nproc-per-node=1"]
    assert ds["train_batch_size"] == int(flag(line, "--global-batch-size")) == 4
    assert ds["train_micro_batch_size_per_gpu"] == int(flag(line, "--micro-batch-size")) == 2
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"]["stage"] == int(flag(line, "--zero-stage")) == 1
    assert ds["bf16"]["enabled"] and "--bf16" in line
    assert flag(line, "--deepspeed_config") == str(seed / "ds_config.json")
    assert flag(line, "--num-layers") == "2" and flag(line, "--hidden-size") == "64"
    assert flag(line, "--seq-length") == "128" and flag(line, "--train-iters") == str(SCORE_ITERS)
    # The fork ran on DeepSpeed's CPU accelerator over gloo.
    log = (seed / "run.log").read_text()
    assert "Setting accelerator to CPU" in log or "accelerator: cpu" in log.lower(), log[:3000]


def test_a_chained_seed_resumes_from_deepspeeds_checkpoint(ws, scored):
    # The first test's median logged interval (its first left out: warm-up): CI's two workers share two cores,
    # and a test beside the first one may slow some of its intervals, not the chain's.
    logged = [float(ms) for ms in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)",
                                             (ws / f"results/{BENCH}/seed_1/mllog.txt").read_text())]
    per_iter = statistics.median(logged[1:]) / 1000
    # A multiple of the log interval (10): the fork logs only those iterations, and a run whose last iteration
    # is not logged is taken for unfinished (segment_end.py's success, the kind's finish_seed).
    train_iters = 10 * max(100, min(1000, math.ceil(CHAIN_SECONDS / per_iter / 10)))
    spec = benchmark(CHAIN, segments={"job_seconds": 100, "margin_seconds": 30, "max_stalls": 2})
    (ws / f"config/benchmarks/{CHAIN}.yaml").write_text(yaml.safe_dump(spec))
    started = time.monotonic()
    run_snakemake(ws, "-c2", f"results/{CHAIN}/seed_1/run.json", "--configfile",
                  configfile(ws, "chain", [CHAIN], train_iters=train_iters, save_interval=500),
                  "--config", "system=device-h200", env=cpu_env(), timeout=600)
    seed = ws / f"results/{CHAIN}/seed_1"
    run = json.loads((seed / "run.json").read_text())
    segments = json.loads((seed / "segments.json").read_text())["segments"]
    print(f"chained: {train_iters} iterations ({per_iter * 1000:.1f} ms each in the first test) in "
          f"{time.monotonic() - started:.0f} s: " + "; ".join(
              f"{s['from_step']}->{s['to_step']} {s['class']} train {s['train_s']} s wall {s['wall_s']} s"
              for s in segments))
    assert run["status"] == "success", run
    # Jobs stopped by the fork's 1-minute clock (100 s less the 30 s margin), each saved there and resumed by the
    # next from that checkpoint, then the one that finished: two at the measured speed.
    assert len(segments) >= 2 and segments[-1]["class"] == "finished", segments
    assert [s["class"] for s in segments[:-1]] == ["saved_at_limit"] * (len(segments) - 1), segments
    assert [s["status"] for s in segments] == ["resume"] * (len(segments) - 1) + ["success"], segments
    assert all(a["to_step"] == b["from_step"] for a, b in zip(segments, segments[1:]))
    assert segments[0]["from_step"] == 0 and segments[-1]["to_step"] == train_iters
    assert all(s["train_s"] <= 60 for s in segments[:-1])
    saved = segments[0]["to_step"]
    assert 0 < saved < train_iters
    first = (seed / "attempt_1" / "run.log").read_text()
    assert "exiting program after 1.0" in first and f"saved checkpoint at iteration {saved:>7}" in first
    # DeepSpeed's layout: global_step<N>/ of the save interval, of the stop, of the end, and `latest`.
    ckpt = seed / "checkpoints"
    assert {f"global_step{n}" for n in (500, saved, train_iters)} <= {p.name for p in ckpt.iterdir()}
    assert (ckpt / "latest").read_text().strip() == f"global_step{train_iters}"
    # The second job loaded that checkpoint, and its first logged iteration is past the saved step.
    second = (seed / "attempt_2" / "run.log").read_text()
    assert re.search(rf"successfully loaded checkpoint from {re.escape(str(ckpt))} at iteration {saved}\b", second)
    logged = iterations(second)
    assert logged and saved < logged[0] <= saved + 10 and logged[-1] == train_iters, logged[:3]
    assert iterations(first)[-1] <= saved
    # The seed's log is the finishing job's, scored: the curve runs to the last iteration.
    assert int(run["curve"][-1][0]) == train_iters and run["evals"]


def test_two_ranks_train_data_parallel_over_gloo(ws, scored):
    """The 2xdp layout: torchrun starts two ranks, DeepSpeed's ZeRO-1 over gloo, GBS 8 = MBS 2 x GA 2 x DP 2."""
    name = f"{BENCH}_dp2"
    (ws / f"config/benchmarks/{name}.yaml").write_text(yaml.safe_dump(benchmark(name)))
    started = time.monotonic()
    run_snakemake(ws, "-c2", f"results/{name}/seed_1/run.json", "--configfile",
                  configfile(ws, "dp2", [name], layout="gpt-mini-2xdp", gbs=8, train_iters=100),
                  "--config", "system=device-h200x2", env=cpu_env(gpus=2), timeout=600)
    seed = ws / f"results/{name}/seed_1"
    run = json.loads((seed / "run.json").read_text())
    print(f"2xdp: {time.monotonic() - started:.0f} s; {run['throughput']['iter_time_s'] * 1000:.1f} ms an iteration")
    assert run["status"] == "success" and run["problems"] == [], run
    assert run["throughput"]["gpus"] == 2 and run["global_batch_size"] == 8
    assert [int(c[0]) for c in run["curve"]] == list(range(10, 101, 10)) and run["evals"]
    line = shlex.split((seed / "launch.sh").read_text().strip().splitlines()[-1])
    assert line[:3] == ["torchrun", "--standalone", "--nproc-per-node=2"]
    ds = json.loads((seed / "ds_config.json").read_text())
    assert ds["train_batch_size"] == int(flag(line, "--global-batch-size")) == 8
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2 == 8
