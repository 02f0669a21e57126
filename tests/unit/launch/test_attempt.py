"""The attempt policy (mlrepro.launch.attempt): one class per ended attempt, the shared budget, the hang rule."""

from __future__ import annotations

import pytest

from mlrepro.launch import attempt as A

TRACEBACK = """\
 iteration       10/     650 | consumed samples: 320 | elapsed time per iteration (ms): 130.0 | lm loss: 9.1E+00 |
[rank0]: Traceback (most recent call last):
[rank0]:   File "/tmp/m/pretrain_gpt.py", line 310, in <module>
[rank0]:     pretrain(
[rank0]:   File "/tmp/m/megatron/core/optimizer/distrib_optimizer.py", line 1204, in load_parameter_state_from_dp_zero
[rank0]:     step = state_dict_dp_zero["step"]
[rank0]: KeyError: 'step'
[rank0]:[W1126 23:01:49.8194 ProcessGroupNCCL.cpp:1575] Warning: destroy_process_group() was not called
mlrepro: wall-time reached, run stopped
"""


@pytest.mark.parametrize("ended, expected", [
    (A.Ended("COMPLETED", finished=True), A.FINISHED),
    (A.Ended("FAILED", finished=True), A.FINISHED),  # run_stop was logged: the run is over whatever came after
    (A.Ended("COMPLETED", saved_at_limit=True, log_text="progress: step 40/400"), A.SAVED_AT_LIMIT),
    (A.Ended("TIMEOUT", saved_at_limit=True), A.SAVED_AT_LIMIT),
    (A.Ended("CANCELLED", log_text="progress: step 40/400"), A.CANCELLED),
    (A.Ended("PREEMPTED"), A.CANCELLED),
    (A.Ended("NODE_FAIL", log_text="progress: step 40/400"), A.NODE_FAILURE),
    (A.Ended("PREFLIGHT_FAILED"), A.NODE_FAILURE),
    (A.Ended("FAILED", node_side="GPU error in the run's log: Xid 79"), A.NODE_FAILURE),
    (A.Ended("HUNG", log_text="progress: step 40/400"), A.HUNG),
    (A.Ended("FAILED", log_text="Traceback (most recent call last):\nKeyError: 'step'\n", exit_code=1),
     A.FAILED_BEFORE_FIRST_STEP),
    (A.Ended("FAILED", log_text=TRACEBACK, exit_code=1), A.FAILED_MID_RUN),
    (A.Ended("TIMEOUT", log_text="progress: step 10/400\n"), A.FAILED_MID_RUN),
    (A.Ended("TIMEOUT"), A.FAILED_BEFORE_FIRST_STEP),
    (A.Ended("FAILED", log_text=':::MLLOG {"key": "eval_accuracy", "value": 1.2, "metadata": {"samples_count": 480}}'),
     A.FAILED_MID_RUN),
])
def test_each_ended_attempt_has_one_class(ended, expected):
    assert A.classify(ended) == expected
    assert expected in A.CLASSES and expected in A.DESCRIPTIONS


def test_error_lines_are_the_trainers_last_traceback():
    lines = A.error_lines(TRACEBACK)
    assert lines[0].endswith("Traceback (most recent call last):")
    assert lines[-1].endswith("KeyError: 'step'")
    assert not any(ln.startswith("mlrepro:") for ln in lines)


def test_error_lines_without_a_traceback_are_the_lines_that_look_like_errors():
    text = "loading\nRuntimeError: CUDA out of memory\nstill here\nsrun: error: node2: task 1: Exited with exit code 1\n"
    assert A.error_lines(text) == ["RuntimeError: CUDA out of memory"]  # srun's own line is the launcher's
    assert A.error_lines("all fine\nprogress: step 10/20\n", strict=True) == []
    assert A.error_lines("all fine\nprogress: step 10/20\n") == ["all fine", "progress: step 10/20"]  # its last words


def test_signature_ignores_numbers_and_addresses_but_not_the_error():
    one = A.signature(TRACEBACK)
    other_attempt = A.signature(TRACEBACK.replace("1204", "1311").replace("23:01:49", "23:05:02"))
    assert one is not None and one == other_attempt
    assert A.signature(TRACEBACK.replace("KeyError: 'step'", "KeyError: 'exp_avg'")) != one
    assert A.signature("progress: step 10/20\n") is None


def test_a_failure_before_the_first_new_step_ends_the_seed_at_once():
    budget = A.Budget(retries=5)
    verdict = budget.after(A.FAILED_BEFORE_FIRST_STEP, "abc", progressed=False, chained=True)
    assert not verdict.go_on and "retrying cannot mend" in verdict.reason


def test_a_bad_checkpoint_set_aside_lets_the_seed_go_on_once_per_cause():
    budget = A.Budget(retries=1)
    assert budget.after(A.FAILED_BEFORE_FIRST_STEP, "load", progressed=False, chained=True, recovered=True).go_on
    # From the previous checkpoint the same error again: nothing left to set aside, the seed ends.
    assert not budget.after(A.FAILED_BEFORE_FIRST_STEP, "load", progressed=False, chained=True).go_on


def test_the_same_error_twice_in_a_row_ends_the_seed():
    budget = A.Budget(retries=10)
    assert budget.after(A.FAILED_MID_RUN, "nccl", progressed=True, chained=True).go_on
    verdict = budget.after(A.FAILED_MID_RUN, "nccl", progressed=True, chained=True)
    assert not verdict.go_on and verdict.reason == "the same error twice in a row"


def test_a_different_error_or_a_node_failure_between_does_not_count_as_the_same():
    budget = A.Budget(retries=10)
    assert budget.after(A.FAILED_MID_RUN, "a", progressed=True, chained=True).go_on
    assert budget.after(A.FAILED_MID_RUN, "b", progressed=True, chained=True).go_on
    assert budget.after(A.NODE_FAILURE, None, progressed=False, chained=True).go_on
    assert budget.after(A.FAILED_MID_RUN, "a", progressed=True, chained=True).go_on


def test_one_budget_bounds_failures_in_a_row_and_progress_refills_it():
    budget = A.Budget(retries=2)
    for _ in range(2):
        assert budget.after(A.HUNG, None, progressed=False, chained=True).go_on
    assert budget.after(A.NODE_FAILURE, None, progressed=True, chained=True).go_on  # a new checkpoint: refilled
    assert budget.after(A.HUNG, None, progressed=False, chained=True).go_on
    assert budget.after(A.HUNG, None, progressed=False, chained=True).go_on
    verdict = budget.after(A.HUNG, None, progressed=False, chained=True)
    assert not verdict.go_on and "3 failed attempt(s) in a row" in verdict.reason
    assert budget.history.count(A.HUNG) == 5


def test_segments_saved_at_their_limit_never_use_the_budget():
    budget = A.Budget(retries=0)
    for _ in range(50):
        assert budget.after(A.SAVED_AT_LIMIT, None, progressed=True, chained=True).go_on
    assert not budget.after(A.FINISHED, None, progressed=True, chained=True).go_on


def test_a_cancelled_single_job_stays_cancelled_and_a_chain_goes_on():
    assert not A.Budget(retries=3).after(A.CANCELLED, None, progressed=False, chained=False).go_on
    assert A.Budget(retries=0).after(A.CANCELLED, None, progressed=False, chained=True).go_on


def test_hang_rule_from_the_benchmark_block():
    assert A.HangRule.of(None) == A.HangRule()
    assert A.HangRule.of({"enabled": False}) is None
    rule = A.HangRule.of({"multiple": 4, "floor_seconds": 10, "startup_seconds": 30})
    assert rule.timeout(None) == 30 and rule.timeout(1.0) == 10 and rule.timeout(5.0) == 20


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_hang_watch_uses_five_times_the_longest_interval_with_a_floor(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    clock = Clock()
    watch = A.HangWatch(A.HangRule(multiple=5, floor_s=20, startup_s=60), lambda: [log], clock)
    clock.t = 59
    assert watch.poll() is None  # still starting up
    for step in range(1, 6):
        with open(log, "a") as fh:
            fh.write(f"mini_gpt progress: step {step * 10}/400 tokens 1 loss 3.0 iter_s 0.1\n")
        clock.t += 6 if step > 1 else 1
        assert watch.poll() is None
    assert watch.longest == 6 and watch.progress_lines == 5
    with open(log, "a") as fh:
        fh.write("some output that is not a step")  # no newline yet: not a line
    clock.t += 30
    assert watch.poll() is None  # 30 s quiet <= 5 x 6 s
    clock.t += 1
    why = watch.poll()
    assert why is not None and "no progress for 31 s" in why and "progress: step 50/400" in why


def test_hang_watch_before_the_first_step_waits_for_the_startup_timeout(tmp_path):
    log = tmp_path / "run.log"
    clock = Clock()
    watch = A.HangWatch(A.HangRule(multiple=5, floor_s=20, startup_s=60), lambda: [log], clock)
    clock.t = 60
    assert watch.poll() is None  # the log does not even exist yet
    log.write_text("loading checkpoint\n")
    clock.t = 61
    why = watch.poll()
    assert "since it started" in why and "loading checkpoint" in why


def test_hang_watch_floor_holds_for_fast_steps(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    clock = Clock()
    watch = A.HangWatch(A.HangRule(multiple=5, floor_s=20, startup_s=60), lambda: [log], clock)
    for _ in range(3):
        with open(log, "a") as fh:
            fh.write(" iteration      120/     400 | consumed samples: 3840 |\n")
        clock.t += 0.1
        watch.poll()
    clock.t += 19.5
    assert watch.poll() is None
    clock.t += 1
    assert watch.poll() is not None


def test_steps_replayed_before_a_resume_are_not_new_steps():
    replay = ':::MLLOG {"key": "eval_accuracy", "value": 3.9, "metadata": {"samples_count": 640}}\n'
    resumed = replay + "mini_gpt: resuming from /c/step_00000040 (step 40)\n"
    assert A.steps_in(replay) == [640]
    assert A.steps_in(resumed) == []
    died = resumed + "Traceback (most recent call last):\nRuntimeError: PytorchStreamReader failed\n"
    assert A.classify(A.Ended("FAILED", log_text=died, exit_code=1)) == A.FAILED_BEFORE_FIRST_STEP
    went_on = resumed + "mini_gpt progress: step 50/400 tokens 1 loss 3.0 iter_s 0.1\n"
    assert A.steps_in(went_on) == [50]
    megatron = (" iteration      100/     650 | consumed samples: 1600 |\n"
                " successfully loaded checkpoint from /c [ t 1/1, p 1/1 ] at iteration 100\n")
    assert A.steps_in(megatron) == []


def test_words_in_paths_are_no_errors():
    text = "mini_gpt: resuming from /tmp/test_failed_run/checkpoints (step 30)\nloading /data/error_cases/x.bin\n"
    assert A.error_lines(text, strict=True) == [] and A.signature(text) is None


TORCHRUN = """\
W1128 13:00:00.000 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process
mini_gpt train.py: N_EMBD=192 is not a multiple of N_HEAD=5
mini_gpt train.py: N_EMBD=192 is not a multiple of N_HEAD=5
E1128 13:00:01.000 1 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 2) local_rank: 0
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/distributed/run.py", line 892, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
Root Cause (first observed failure):
  exitcode  : 2 (pid: 1234)
============================================================
srun: error: node1: task 0: Exited with exit code 2
"""


def test_the_trainers_words_stand_before_the_launchers_report():
    assert A.error_lines(TORCHRUN)[-1] == "mini_gpt train.py: N_EMBD=192 is not a multiple of N_HEAD=5"
    assert A.signature(TORCHRUN) is None  # no error a second attempt could repeat by name
    assert A.classify(A.Ended("FAILED", log_text=TORCHRUN, exit_code=2)) == A.FAILED_BEFORE_FIRST_STEP
    inner = TORCHRUN.replace("mini_gpt train.py: N_EMBD", "Traceback (most recent call last):\nValueError: N_EMBD")
    assert A.error_lines(inner)[-1].startswith("ValueError: N_EMBD=192")


def test_an_injected_kill_is_its_own_class_and_the_seed_goes_on_without_spending_its_retries():
    killed = A.Ended(A.INJECTED_STATE, log_text="progress: step 10/400\n")
    assert A.classify(killed) == A.INJECTED and A.INJECTED in A.CLASSES and A.INJECTED in A.DESCRIPTIONS
    # before its first step too: an injected kill is no load error
    assert A.classify(A.Ended(A.INJECTED_STATE)) == A.INJECTED
    # run_stop logged before the kill landed: the run is over
    assert A.classify(A.Ended(A.INJECTED_STATE, finished=True)) == A.FINISHED
    budget = A.Budget(retries=0)
    for chained in (True, False):  # a seed without segments starts again
        assert all(budget.after(A.INJECTED, None, progressed=False, chained=chained).go_on for _ in range(5))
    assert budget.used == 0
    # a real failure after injected ones still has its whole budget (0 here: it ends the seed)
    assert not budget.after(A.FAILED_MID_RUN, "sig", progressed=False, chained=True).go_on


def test_injected_kill_times_are_exponential_seeded_and_independent_per_seed_and_attempt():
    inject = A.Injection.of({"mtbf_seconds": 30, "seed": 7})
    assert inject == A.Injection(30.0, 7) and A.Injection.of(None) is None
    # the same draw after a workflow restart
    assert inject.kill_after(1, 3) == A.Injection(30.0, 7).kill_after(1, 3)
    draws = [inject.kill_after(seed, attempt) for seed in range(1, 41) for attempt in range(1, 51)]
    assert len(set(draws)) == len(draws)
    mean = sum(draws) / len(draws)
    assert 27 < mean < 33  # 2,000 draws: the mean within ~4.5 standard errors of 30 s
    # exponential: P(T > mtbf) = 1/e
    assert abs(sum(d > 30 for d in draws) / len(draws) - 0.3679) < 0.05
    assert A.Injection(30.0, 8).kill_after(1, 3) != inject.kill_after(1, 3)
    assert "mean time between failures 30 s" in inject.reason(12.3)
    assert inject.reason(12.3).startswith(A.INJECTED)


def test_how_long_a_hang_went_on_is_read_from_the_watchs_reason():
    why = "no progress for 42 s (timeout 40 s: 5 x the longest interval between progress lines, 8.0 s, at least 10 s)"
    assert A.hung_for(why) == 42.0 and A.hung_for("hung: " + why) == 42.0
    assert A.hung_for("Slurm job 7 ended FAILED") is None and A.hung_for(None) is None
