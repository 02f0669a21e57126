"""A Megatron-LM GPT seed as a chain of time-limited jobs (issue 23): Megatron's own --save/--load and
--exit-duration-in-mins, its checkpoint folder understood by the chain, its end of job in the chain's words."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlrepro import config as mlrepro_config
from mlrepro.kinds import megatron as megatron_seed
from mlrepro.launch import chain as segments
from mlrepro.launch.job import SeedFailed
from mlrepro.paths import SeedPaths
from mlrepro.formats import checkpoints
from mlrepro.corpus import blend
from mlrepro.formats import indexed
from workspace import FIXTURES, make_workspace

ROOT = Path(__file__).resolve().parents[3]
RUN_AND_TIME = ROOT / "implementations/megatron_gpt/run_and_time.sh"


def _workspace(dest: Path) -> Path:
    """A workspace whose corpus stages have run: a 64-token blend and a 554-token vocabulary."""
    import numpy as np

    ws = make_workspace(dest)
    corpus = ws / "resources" / "corpora" / "mini_corpus"
    prefix = corpus / "preprocessed" / "train_chunk_0_text_document"
    prefix.parent.mkdir(parents=True)
    w = indexed.IndexedWriter(f"{prefix}.bin")
    w.add_document(np.arange(64, dtype=np.uint16))
    w.finalize(f"{prefix}.idx")
    blend.write_blend([str(prefix)], corpus / "data_prefix.json")
    (corpus / "tokenizer").mkdir()
    (corpus / "tokenizer" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(554)}))
    return ws


def chained_benchmark(ws: Path, job_seconds: float, margin: float) -> None:
    text = (ws / "config/benchmarks/gpt_126m.yaml").read_text().replace("name: gpt_126m", "name: gpt_126m_chain")
    text += f"segments: {{job_seconds: {job_seconds}, margin_seconds: {margin}, max_stalls: 2}}\n"
    (ws / "config/benchmarks/gpt_126m_chain.yaml").write_text(text)


def test_a_chained_seed_saves_and_loads_with_megatron_and_runs_under_the_job_limit(tmp_path):
    ws = _workspace(tmp_path / "ws")
    chained_benchmark(ws, 100, 30)
    settings = mlrepro_config.load({"benchmarks": ["gpt_126m_chain"], "system": "device-h200x2",
                                    "pretrain": {"train_iters": 650, "gbs": 16, "mbs": 8, "save_interval": 50,
                                                 "megatron": str(FIXTURES / "megatron_standin")}}, ws)
    plan = megatron_seed.prepare(settings, "gpt_126m_chain", 1)
    argv = shlex.split(Path(plan.env["MEGATRON_LAUNCH_FILE"]).read_text())
    folder = str(plan.seed_dir / "checkpoints")
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == folder
    assert argv[argv.index("--save-interval") + 1] == "50"
    # torch_dist checkpoints of the distributed optimizer do not load without apex/TE (4x H200): legacy format
    assert argv[argv.index("--ckpt-format") + 1] == "torch"
    # Resumable without apex/TE only through megatron_resume, which runs pretrain_gpt.py; the save signal saves.
    assert argv[argv.index("-m") + 1: argv.index("-m") + 3] == ["megatron_resume", "pretrain_gpt.py"]
    assert argv[argv.index("--exit-signal") + 1] == "SIGUSR1" and "--exit-signal-handler" in argv
    assert (plan.env["CHECKPOINT_DIR"], plan.env["JOB_SECONDS"], plan.env["MARGIN_SECONDS"]) == (folder, "100", "30")
    assert plan.walltime_minutes == 2  # the job limit, in Slurm's whole minutes
    # Without segments: nothing saved, no job limit (the seed is one job, as before).
    plain = megatron_seed.prepare(mlrepro_config.load(
        {"benchmarks": ["gpt_126m"], "system": "device-h200x2",
         "pretrain": {"train_iters": 300, "megatron": str(FIXTURES / "megatron_standin")}}, ws), "gpt_126m", 1)
    plain_line = Path(plain.env["MEGATRON_LAUNCH_FILE"]).read_text()
    assert "--save" not in plain_line and "megatron_resume" not in plain_line and "JOB_SECONDS" not in plain.env


FAKE_MEGATRON = r'''
import sys
print("args:", " ".join(sys.argv[1:]))
print("  successfully loaded checkpoint from /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 260")
for it in (270, 280):
    print(f" [2026-11-26 23:00:00.0] iteration {it:8d}/     650 | consumed samples: {16 * it} | "
          "elapsed time per iteration (ms): 115.0 | lm loss: 3.9E+00 |")
print(" validation loss at iteration 280 | lm loss value: 3.950000E+00 | lm loss PPL: 51.9 |")
print("  [2026-11-26 23:00:01.0] successfully saved checkpoint from iteration     280 to /ckpt [ t 1/1 ]")
print("[2026-11-26 23:00:01] exiting program after 1.0004 minutes")
'''


def run_and_time(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "fake_megatron.py").write_text(FAKE_MEGATRON)
    launch = tmp_path / "launch.sh"
    launch.write_text(shlex.join(["python3", str(tmp_path / "fake_megatron.py"), "--train-iters", "650"]) + "\n")
    return subprocess.run(["bash", str(RUN_AND_TIME)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MEGATRON_DIR": str(tmp_path), "MEGATRON_LAUNCH_FILE": str(launch), **env})


def test_run_and_time_gives_megatron_the_job_limit_and_tells_the_chain_where_it_stopped(tmp_path):
    out = run_and_time(tmp_path, CHECKPOINT_DIR=str(tmp_path / "ckpt"), JOB_SECONDS="100", MARGIN_SECONDS="30")
    assert out.returncode == 0, out.stderr
    assert "--train-iters 650 --exit-duration-in-mins 1" in out.stdout  # (100 - 30) s: one whole minute
    said = segments.segment_record(out.stdout)
    assert said == {"status": "resume", "from_step": 260, "to_step": 280, "train_s": 2.3, "val_loss": 3.95}
    assert not segments.finished(out.stdout)


def test_a_save_on_the_signal_ends_the_segment_as_its_clock_would(tmp_path):
    (tmp_path / "fake_megatron.py").write_text(FAKE_MEGATRON.replace("after 1.0004 minutes", "after receiving SIGTERM."))
    launch = tmp_path / "launch.sh"
    launch.write_text(shlex.join(["python3", str(tmp_path / "fake_megatron.py")]) + "\n")
    out = subprocess.run(["bash", str(RUN_AND_TIME)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MEGATRON_DIR": str(tmp_path), "MEGATRON_LAUNCH_FILE": str(launch),
                              "CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stderr
    assert segments.segment_record(out.stdout)["status"] == "resume"


def test_a_job_limit_under_megatrons_one_minute_is_refused(tmp_path):
    out = run_and_time(tmp_path, CHECKPOINT_DIR=str(tmp_path / "ckpt"), JOB_SECONDS="80", MARGIN_SECONDS="30")
    assert out.returncode == 2 and "under one minute" in out.stderr


def test_an_unchained_run_is_megatron_itself(tmp_path):
    out = run_and_time(tmp_path)
    assert out.returncode == 0 and "exit-duration" not in out.stdout and "segment:" not in out.stdout


def megatron_segment(folder: Path, log: Path, saved: int, line: str | None, killed: bool = False):
    def run() -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"iter_{saved:07d}").mkdir(exist_ok=True)
        (folder / checkpoints.MEGATRON_TRACKER).write_text(str(saved))
        log.write_text(f" iteration {saved + 7:8d}/     650 | consumed samples: 1 | elapsed time per iteration (ms): 100.0 |\n"
                       + (line + "\n" if line else ""))
        if killed:
            raise SeedFailed("killed with SIGKILL")
    return run


def test_the_chain_follows_megatrons_checkpoints_through_a_killed_segment(tmp_path):
    seed, log = tmp_path / "seed_1", tmp_path / "seed_1" / "run.log"
    folder = seed / SeedPaths.CHECKPOINTS
    said = lambda status, a, b: "segment: " + json.dumps({"status": status, "from_step": a, "to_step": b,  # noqa: E731
                                                          "train_s": 30.0, "val_loss": 4.0})
    stop = ':::MLLOG {"key": "run_stop", "metadata": {"status": "success"}}'
    jobs = iter([megatron_segment(folder, log, 260, said("resume", 0, 260)),
                 megatron_segment(folder, log, 300, None, killed=True),  # killed after its save at 300
                 megatron_segment(folder, log, 560, said("resume", 300, 560)),
                 megatron_segment(folder, log, 650, said("success", 560, 650) + "\n" + stop)])
    state = segments.run_seed(SimpleNamespace(seed_dir=seed, seed=1, ranks=1), None, log, lambda *_: next(jobs)(),
                              segments.Limits(100, 30), retries=1)
    chain = state["segments"]
    assert [s["status"] for s in chain] == ["resume", "killed", "resume", "success"]
    assert [s["class"] for s in chain] == ["saved_at_limit", "failed_mid_run", "saved_at_limit", "finished"]
    assert (chain[1]["lost_steps"], chain[1]["lost_s"]) == (7, 0.7)  # Megatron's own step time
    assert [(s["from_step"], s["to_step"]) for s in chain] == [(0, 260), (260, 300), (300, 560), (560, 650)]
    assert checkpoints.latest_step(folder) == 650


@pytest.mark.parametrize("tracker, expected", [(None, 0), ("120", 120), ("release", 0)])
def test_megatrons_tracker_file_names_the_last_complete_checkpoint(tmp_path, tracker, expected):
    if tracker is not None:
        (tmp_path / checkpoints.MEGATRON_TRACKER).write_text(tracker + "\n")
    assert checkpoints.latest_step(tmp_path) == expected
