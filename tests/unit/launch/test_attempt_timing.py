"""What a chain records of each attempt for its effective training time (mlrepro.launch.chain): the
steady seconds per step, the seconds its timed steps add up to, its checkpoint writes; on the log of a
real resumed mini_gpt attempt (tests/workflow/test_goodput_local.py's fifth attempt)."""

from __future__ import annotations

import pytest

from mlrepro.launch import chain

RESUMED = """\
:::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "eval_accuracy", "value": 3.6, "metadata": {"samples_count": 1280}}
mini_gpt progress: step 10/400 tokens 20480 loss 5.8130 iter_s 0.2858
mini_gpt: resuming from /tmp/ws/results/mini_gpt/seed_1/checkpoints/step_00000080 (step 80)
mini_gpt progress: step 90/400 tokens 184320 loss 3.4183 iter_s 0.4149
mini_gpt progress: step 100/400 tokens 204800 loss 3.4460 iter_s 0.4167
mini_gpt checkpoint: step 100 written in 0.043 s
mini_gpt progress: step 110/400 tokens 225280 loss 3.4334 iter_s 0.4435
mini_gpt progress: step 120/400 tokens 245760 loss 3.5244 iter_s 0.4438
mini_gpt segment: {"status": "success", "from_step": 80, "to_step": 120, "train_s": 18.308, "wall_s": 18.308, "val_loss": 3.49, "clock_s": 60.744}
"""


def test_the_attempts_own_steps_are_timed_and_its_writes_counted_apart():
    trained = chain._trained_steps(RESUMED)  # the chain's own reading of the log
    assert [s for s, _ in trained] == [90, 100, 110, 120]  # the replayed step 10 is no step of this attempt
    writes = chain.checkpoint_writes(RESUMED)
    assert writes == [(100, 0.043)]
    # the first interval (a warm-up after the load) and the one holding the write at step 100 left out
    assert chain.steady_step_seconds(trained, [s for s, _ in writes]) == (0.4167 + 0.4438) / 2
    # its steps from step 80: 10 steps a line
    assert chain.stepping_seconds(trained, 80) == round(10 * (0.4149 + 0.4167 + 0.4435 + 0.4438), 3)
    assert chain.stepping_seconds([], 80) is None and chain.steady_step_seconds([], []) is None


def test_megatrons_saves_are_counted_with_their_timer():
    """The two Megatron stacks' save messages (a chained gpt_126m_deepspeed attempt on an H200,
    docs/measurements/megatron_deepspeed/h200x2_acceptance/dsc/attempt_2_run.log, and Megatron-LM's wording),
    each timed by the save-checkpoint timer printed after it, the slowest rank's."""
    from pathlib import Path

    real = (Path(__file__).parents[3] / "docs/measurements/megatron_deepspeed/h200x2_acceptance/dsc/"
            "attempt_2_run.log").read_text()
    assert chain.checkpoint_writes(real) == [(200, pytest.approx(1.44614)), (264, pytest.approx(1.40619))]
    megatron_lm = ("  successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1, p 1/1 ]\n"
                   "(min, max) time across ranks (ms):\n    save-checkpoint ................: (210.50, 250.25)\n"
                   "  successfully saved checkpoint from iteration     200 to /ckpt [ t 1/1, p 1/1 ]\n")
    assert chain.checkpoint_writes(megatron_lm) == [(100, pytest.approx(0.25025)), (200, 0.0)]
