"""mlrepro.scoring.tfevents: a trainer's TensorBoard event files read through tensorboard's own reader (written
here by torch's SummaryWriter, the writer Megatron-LM uses, with its tags), whatever bytes a file holds; and a
scored seed's curve written by tensorboard's own writer, read back equal."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from torch.utils.tensorboard import SummaryWriter

from mlrepro.paths import SeedPaths
from mlrepro.pretrain import progress
from mlrepro.scoring import megatron_score, tfevents
from mlrepro.scoring.report import _evals_by_run
from workspace import FIXTURES

RECORDED = FIXTURES / "megatron" / "megatron_sdpa.log"  # a real Megatron-LM run on an H100: GBS 16, 300 iterations


def f32(x: float) -> float:
    """What a SummaryWriter's simple_value keeps of a float."""
    return float(np.float32(x))


def megatron_events(folder: Path, iterations: int = 30, gbs: int = 16, evals=(10, 20, 30), prefix: str = "",
                    start: int = 1) -> dict[str, list[tuple[int, float]]]:
    """Event files as Megatron-LM writes them (megatron/training/training.py at the pinned commit: training_log
    and evaluate_and_print_results); `prefix` gives Megatron-DeepSpeed's grouped names. Returns what was written."""
    train, valid = (f"{prefix}lm loss", f"{prefix}lm loss validation") if not prefix else \
        ("lm-loss-training/lm loss", "lm-loss-validation/lm loss validation")
    written: dict[str, list[tuple[int, float]]] = {}
    writer = SummaryWriter(log_dir=str(folder), max_queue=1000)

    def add(tag, value, step):
        writer.add_scalar(tag, value, step)
        written.setdefault(tag, []).append((step, f32(value)))

    for it in range(start, iterations + 1):
        loss = 10.0 / (1 + 0.1 * it)
        add(train, loss, it)
        add(f"{train} vs samples", loss, it * gbs)
        add("iteration-time" if not prefix else "iteration-time/iteration-time", 0.15 + it * 1e-4, it)
        if it in evals:
            add(valid, loss + 0.1, it)
            add(f"{valid} vs samples", loss + 0.1, it * gbs)
    writer.close()
    return written


def test_megatron_lm_tags_read_through_tensorboards_reader(tmp_path):
    written = megatron_events(tmp_path / "tb")
    scalars = tfevents.read_scalars(tmp_path / "tb")
    assert scalars.skipped == [] and len(scalars.files) == 1
    assert {tag: scalars.series[tag] for tag in written} == written
    curves = tfevents.trainer_curves(tmp_path / "tb")
    assert curves.training == written["lm loss"] and curves.validation == written["lm loss validation"]
    assert curves.validation_by_samples == [(160, f32(10 / 2 + .1)), (320, f32(10 / 3 + .1)), (480, f32(10 / 4 + .1))]
    assert [s for s, _ in curves.iteration_time] == list(range(1, 31))
    # TensorBoard's own accumulator agrees on the steps and values
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("lm loss validation")] == curves.validation


def test_megatron_deepspeed_grouped_tags_and_a_folder_without_events(tmp_path):
    written = megatron_events(tmp_path / "ds", prefix="ds")
    curves = tfevents.trainer_curves(tmp_path / "ds")
    assert curves.training == written["lm-loss-training/lm loss"]
    assert curves.validation == written["lm-loss-validation/lm loss validation"]
    assert curves.validation_by_samples == written["lm-loss-validation/lm loss validation vs samples"]
    assert tfevents.trainer_curves(tmp_path / "nothing") is None
    (tmp_path / "empty").mkdir()
    assert tfevents.trainer_curves(tmp_path / "empty") is None


def test_a_resumed_segment_replaces_the_steps_it_trained_again(tmp_path):
    """A chained seed's second job resumes from its checkpoint at 20 and logs 21..30 again into a new file."""
    first = megatron_events(tmp_path / "tb1", iterations=25, evals=(10, 20))
    again = megatron_events(tmp_path / "tb2", iterations=30, evals=(30,), start=21)
    # each job's writer names its file by its start time (then host, pid): the second job's sorts after
    (tmp_path / "tb").mkdir()
    os.replace(next((tmp_path / "tb1").iterdir()), tmp_path / "tb" / "events.out.tfevents.1800000000.node1.41.0")
    os.replace(next((tmp_path / "tb2").iterdir()), tmp_path / "tb" / "events.out.tfevents.1800000600.node2.17.0")
    training = tfevents.trainer_curves(tmp_path / "tb").training
    assert training == first["lm loss"][:20] + again["lm loss"]
    assert [s for s, _ in training] == list(range(1, 31))


def _one_file(folder: Path) -> bytes:
    (path,) = folder.iterdir()
    return path.read_bytes()


def _read_bytes(tmp_path: Path, name: str, data: bytes) -> tfevents.Scalars:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "events.out.tfevents.1.host.1.0").write_bytes(data)
    return tfevents.read_scalars(folder)


def _is_prefix_of(read: dict, written: dict) -> bool:
    """What was read is, tag by tag, the start of what was written: nothing invented, nothing reordered."""
    return all(tag in written and points == written[tag][:len(points)] for tag, points in read.items())


def test_every_truncation_of_a_real_file_reads_its_whole_records_and_names_the_rest(tmp_path):
    written = megatron_events(tmp_path / "tb", iterations=6, evals=(3, 6))
    data = _one_file(tmp_path / "tb")
    ends, at = {0}, 0  # where the file's records end: a cut there leaves whole records only
    while at < len(data):
        at += 16 + struct.unpack("<Q", data[at:at + 8])[0]
        ends.add(at)
    for cut in range(len(data)):
        scalars = _read_bytes(tmp_path, f"cut{cut}", data[:cut])
        assert _is_prefix_of(scalars.series, written), cut
        if cut in ends:
            assert scalars.skipped == [], cut
        else:
            (why,) = scalars.skipped
            assert "events.out.tfevents" in why and ("not a whole record" in why or "no readable record" in why)
    assert _read_bytes(tmp_path, "whole", data).series == written


def _record(payload: bytes, length: int | None = None) -> bytes:
    """One TFRecord frame with valid CRCs: what passes the reader's checks and must still not crash it."""
    header = struct.pack("<Q", len(payload) if length is None else length)
    return header + struct.pack("<I", masked_crc32c(header)) + payload + struct.pack("<I", masked_crc32c(payload))


@pytest.mark.parametrize("name, tail", [
    ("a length of 2**64-1", _record(b"", (1 << 64) - 1)[:12] + b"x" * 64),
    ("a length of a terabyte", _record(b"", 1 << 40)[:12] + b"x" * 64),
    ("a record that is no Event", _record(b"\xff\xff\xff\x07")),
    ("a nested message 10,000 deep", _record(b"\x2a\x80\x80\x04" + b"\x0a\x80\x80\x04" * 10_000)),
    ("random bytes", bytes(random.Random(7).randrange(256) for _ in range(4096))),
])
def test_corrupt_bytes_after_good_records_are_skipped_with_a_reason(tmp_path, name, tail):
    written = megatron_events(tmp_path / "tb", iterations=4, evals=(4,))
    scalars = _read_bytes(tmp_path, "bad", _one_file(tmp_path / "tb") + tail)
    assert scalars.series == written
    (why,) = scalars.skipped
    assert "events.out.tfevents" in why and ("unreadable after" in why or "not a whole record" in why)


def test_flipped_bytes_never_raise_nor_invent_points(tmp_path):
    written = megatron_events(tmp_path / "tb", iterations=5, evals=(5,))
    data = _one_file(tmp_path / "tb")
    rng = random.Random(11)
    for i in range(300):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        scalars = _read_bytes(tmp_path, f"flip{i}", bytes(bad))
        # a flip the CRCs catch ends the file there; the reader never returns a value the writer did not write
        assert _is_prefix_of(scalars.series, written), i


def test_files_that_are_no_event_files_are_skipped_not_read(tmp_path):
    folder = tmp_path / "tb"
    folder.mkdir()
    os.mkfifo(folder / "events.out.tfevents.fifo")  # opening it would wait for a writer forever
    (folder / "events.out.tfevents.dir").mkdir()
    (folder / "events.out.tfevents.empty").write_bytes(b"")
    (folder / "events.out.tfevents.text").write_text("lm loss: 3.5\n")
    os.symlink(folder / "gone", folder / "events.out.tfevents.dangling")
    scalars = tfevents.read_scalars(folder)
    assert scalars.series == {}
    reasons = {Path(s.split(": ")[0]).name.rsplit(".", 1)[1]: s.split(": ", 1)[1] for s in scalars.skipped}
    assert reasons["fifo"] == reasons["dir"] == "not a regular file"
    assert reasons["text"].startswith("no readable record") and reasons["dangling"].startswith("not readable")
    assert "empty" not in reasons  # a writer that has not flushed yet: nothing to read, nothing wrong


def test_a_scored_curve_written_reads_back_equal(tmp_path):
    run = {"evals": [[1600.0, 4.414262], [3200.0, 4.011168], [4800, 3.6982190123456789]],
           "curve": [[10, 7.25], [20, 6.125], [30, None]]}
    series = tfevents.scored_series(run, "eval_accuracy")
    assert series == {"eval_accuracy vs samples": [(1600, 4.414262), (3200, 4.011168), (4800, 3.6982190123456789)],
                      "lm loss": [(10, 7.25), (20, 6.125)]}
    out = tmp_path / "results" / "tensorboard" / "gpt_126m" / "seed_1"
    tfevents.write_scalars(out, series)
    assert tfevents.read_scalars(out).series == series  # float64 kept: equal, not approximately
    # TensorBoard's own accumulator shows them as scalars of the same values
    acc = event_accumulator.EventAccumulator(str(out), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    shown = [(e.step, float(np.asarray(e.tensor_proto.double_val[0]))) for e in acc.Tensors("eval_accuracy vs samples")]
    assert shown == series["eval_accuracy vs samples"]
    # written again, the folder is replaced whole: one file, nothing beside it
    tfevents.write_scalars(out, {"lm loss": [(1, 2.0)]})
    assert tfevents.read_scalars(out).series == {"lm loss": [(1, 2.0)]} and len(list(out.iterdir())) == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["seed_1"]


def test_the_report_plots_the_trainers_validation_and_falls_back_to_the_log(tmp_path):
    seed = SeedPaths(tmp_path / "results" / "gpt_126m" / "seed_1")
    seed.folder.mkdir(parents=True)
    seed.mllog.write_text(RECORDED.read_text())
    run = megatron_score.training_record(seed.mllog, target_loss=3.9, seed=1).to_json()
    score = {"target": {"metric": "val_loss"}, "runs": [run]}
    # without event files: the validations of the log (iterations 100, 200, 300 at GBS 16, and the one after training)
    ((_, from_log),) = _evals_by_run(score, [seed.mllog])
    assert from_log == [tuple(e) for e in run["evals"]] and from_log[:3] == [(1600, 4.414262), (3200, 4.011168),
                                                                            (4800, 3.698219)]
    written = megatron_events(seed.tensorboard, iterations=300, evals=(50, 100, 150, 200, 250, 300))
    assert _evals_by_run(score, [seed.mllog]) == [("seed 1", [(float(s), v) for s, v in written["lm loss validation vs samples"]])]


def test_status_takes_the_losses_of_the_trainers_event_files(tmp_path):
    seed = tmp_path / "seed_1"
    assert progress.trainer_losses(seed) == {}
    megatron_events(seed / "tensorboard", iterations=30, evals=(10, 20))
    losses = progress.trainer_losses(seed)
    assert losses == {"loss_step": 30, "loss": f32(10 / 4), "val_step": 20, "val_loss": f32(10 / 3 + .1)}
    line = progress.describe({"step": 40, "max_steps": 100, "tokens": None, "iter_s": 0.5, "eta_s": 30.0, **losses})
    assert line == "step 40/100, loss 2.500 at step 30, validation loss 3.433 at step 20, ETA 0:30 (0.500 s/step)"
