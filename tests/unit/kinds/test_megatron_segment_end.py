"""implementations/megatron_gpt/segment_end.py: Megatron-LM's own end-of-job words in the chain's (issue 23)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "implementations/megatron_gpt/segment_end.py"
LOG = ROOT / "tests/fixtures/megatron/megatron_sdpa.log"  # a real 300-iteration run (log interval 10)


def run(text: str) -> list[str]:
    out = subprocess.run([sys.executable, str(SCRIPT)], input=text, capture_output=True, text=True, check=True).stdout
    assert out.startswith(text)  # every line of Megatron's output passes through unchanged
    return out[len(text):].splitlines()


def iterations(text: str, upto: int) -> str:
    keep = []
    for line in text.splitlines(keepends=True):
        if " iteration " in line and "/     300 |" in line and int(line.split("iteration")[1].split("/")[0]) > upto:
            break
        keep.append(line)
    return "".join(keep)


def test_a_finished_run_ends_with_its_segment_and_run_stop():
    text = LOG.read_text()
    seg, stop = run(text)
    record = json.loads(seg.removeprefix("segment: "))
    assert record["status"] == "success" and (record["from_step"], record["to_step"]) == (0, 300)
    assert record["val_loss"] == 3.688399  # the last validation Megatron printed (after training, on the validation set)
    assert 30 < record["train_s"] < 300  # the logged per-iteration times, summed
    assert stop.startswith(":::MLLOG ") and json.loads(stop[9:])["key"] == "run_stop"


def test_a_job_stopped_by_megatrons_clock_names_the_checkpoint_it_saved():
    text = iterations(LOG.read_text(), 150)
    start = "  successfully loaded checkpoint from /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 40\n"
    tail = ("  [2026-11-23 19:31:30.000000] successfully saved checkpoint from iteration     150 to /ckpt "
            "[ t 1/1, gtp_remat 1/1, p 1/1 ]\n[after training is done] datetime: 2026-11-23 19:31:31\n"
            "[2026-11-23 19:31:31] exiting program after 1.0021 minutes\n")
    (seg,) = run(start + text + tail)
    record = json.loads(seg.removeprefix("segment: "))
    assert record["status"] == "resume" and (record["from_step"], record["to_step"]) == (40, 150)
    assert record["val_loss"] == 4.414262  # the validation at iteration 100, the last before the stop


def test_a_killed_job_says_nothing_so_the_chain_resumes_from_the_last_checkpoint():
    text = iterations(LOG.read_text(), 150)
    text += "  [2026-11-23 19:31:30.000000] successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1 ]\n"
    assert run(text) == []


def test_a_run_whose_last_iteration_is_not_logged_finishes_at_its_train_iters():
    """--train-iters 305 at --log-interval 10: the last logged line is 300/305, then the loop's end (planned
    iteration counts such as 4,769 are seldom multiples of the interval). Without the loop's end, a killed job."""
    text = LOG.read_text().replace("/     300 |", "/     305 |")
    assert "[after training is done]" in text
    seg, stop = run(text)
    assert json.loads(seg.removeprefix("segment: "))["to_step"] == 305 and json.loads(stop.removeprefix(":::MLLOG "))["metadata"]["step"] == 305
    cut = text[: text.index("[after training is done]")]
    assert run(cut) == []
