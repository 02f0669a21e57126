"""The sbatch request (mlrepro.slurm.client.SbatchRequest) renders the line the earlier list functions built."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mlrepro.slurm import client as slurm

# What sbatch_command and for_attempt printed at f5e9645, before the request replaced them: the rendered
# request must stay byte-identical. (script, the plan's options, its line, each attempt's line for ATTEMPTS)
ATTEMPTS = [
    dict(exclude=("n1", "n3", "n7"), output="/r/results/b/seed_1/attempt_2/slurm-%j.out",
         workdir="/r/results/b/seed_1/attempt_2"),
    dict(exclude=(), output="/r/results/b/seed_1/attempt_1/slurm-%j.out", workdir="/r/results/b/seed_1/attempt_1"),
    dict(),
]
HEAD = ["sbatch", "--parsable", "--export=ALL", "--no-requeue"]
CASES = [
    ("/r/impl/run.sub", dict(nodes=2, time_minutes=30, partition="batch", account="proj", exclude=["n3", "n1"],
                             job_name="mlrepro-b-seed1-abcd1234"),
     [*HEAD, "--job-name=mlrepro-b-seed1-abcd1234", "--nodes=2", "--time=30", "--partition=batch", "--account=proj",
      "--exclude=n1,n3", "/r/impl/run.sub"],
     [[*HEAD, "--job-name=mlrepro-b-seed1-abcd1234", "--nodes=2", "--time=30", "--partition=batch", "--account=proj",
       "--exclude=n1,n3,n7", "--output=/r/results/b/seed_1/attempt_2/slurm-%j.out",
       "--chdir=/r/results/b/seed_1/attempt_2", "/r/impl/run.sub"],
      [*HEAD, "--job-name=mlrepro-b-seed1-abcd1234", "--nodes=2", "--time=30", "--partition=batch", "--account=proj",
       "--output=/r/results/b/seed_1/attempt_1/slurm-%j.out", "--chdir=/r/results/b/seed_1/attempt_1",
       "/r/impl/run.sub"],
      [*HEAD, "--job-name=mlrepro-b-seed1-abcd1234", "--nodes=2", "--time=30", "--partition=batch", "--account=proj",
       "/r/impl/run.sub"]]),
    ("/r/impl/run.sub", dict(nodes=1, time_minutes=2.5, partition=None, account=None, exclude=[], job_name="j"),
     [*HEAD, "--job-name=j", "--nodes=1", "--time=3", "/r/impl/run.sub"],
     [[*HEAD, "--job-name=j", "--nodes=1", "--time=3", "--exclude=n1,n3,n7",
       "--output=/r/results/b/seed_1/attempt_2/slurm-%j.out", "--chdir=/r/results/b/seed_1/attempt_2",
       "/r/impl/run.sub"],
      [*HEAD, "--job-name=j", "--nodes=1", "--time=3", "--output=/r/results/b/seed_1/attempt_1/slurm-%j.out",
       "--chdir=/r/results/b/seed_1/attempt_1", "/r/impl/run.sub"],
      [*HEAD, "--job-name=j", "--nodes=1", "--time=3", "/r/impl/run.sub"]]),
    ("impl/run.sub", dict(nodes=4, time_minutes=12.5, partition="debug", account="acct",
                          exclude=["node2", "node1", "node2", " "], job_name="mini_lora-seed_3",
                          output="results/seed_3/slurm-%j.out", extra_args=["--gpus-per-node=4"], workdir="impl"),
     [*HEAD, "--job-name=mini_lora-seed_3", "--nodes=4", "--time=13", "--partition=debug", "--account=acct",
      "--exclude=node1,node2", "--output=results/seed_3/slurm-%j.out", "--chdir=impl", "--gpus-per-node=4",
      "impl/run.sub"],
     None),
    ("/r/c/slurm/download.sbatch", dict(partition="debug", account=None, job_name="mlrepro-corpus-c-download-1234abcd",
                                        output="/r/logs/corpora/c/download_task_%a.log", workdir="/r",
                                        extra_args=["--array=3,7-9", "--wait", "--cpus-per-task=2", "--mem=4000M"]),
     [*HEAD, "--job-name=mlrepro-corpus-c-download-1234abcd", "--partition=debug",
      "--output=/r/logs/corpora/c/download_task_%a.log", "--chdir=/r", "--array=3,7-9", "--wait",
      "--cpus-per-task=2", "--mem=4000M", "/r/c/slurm/download.sbatch"],
     None),
    ("run.sub", dict(script_args=["a b", "--x"], nodes=1),
     [*HEAD, "--nodes=1", "run.sub", "a b", "--x"],
     None),
    ("run.sub", {},
     [*HEAD, "run.sub"],
     [[*HEAD, "--exclude=n1,n3,n7", "--output=/r/results/b/seed_1/attempt_2/slurm-%j.out",
       "--chdir=/r/results/b/seed_1/attempt_2", "run.sub"],
      [*HEAD, "--output=/r/results/b/seed_1/attempt_1/slurm-%j.out", "--chdir=/r/results/b/seed_1/attempt_1", "run.sub"],
      [*HEAD, "run.sub"]]),
]


@pytest.mark.parametrize("script,options,line,attempts", CASES, ids=range(len(CASES)))
def test_a_request_renders_the_line_the_list_functions_printed(script, options, line, attempts):
    request = slurm.SbatchRequest(script=script, **options)
    assert request.render() == line
    for where, expected in zip(ATTEMPTS, attempts or []):
        # An attempt changes fields; what it does not set is not on its line.
        attempt = dataclasses.replace(request, exclude=where.get("exclude", ()), output=where.get("output"),
                                      workdir=where.get("workdir"))
        assert attempt.render() == expected


@pytest.mark.parametrize("script,options,line,attempts", CASES, ids=range(len(CASES)))
def test_a_request_survives_json_and_its_own_line(script, options, line, attempts):
    request = slurm.SbatchRequest(script=script, **options)
    assert slurm.SbatchRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    # plan.json of an earlier version held the rendered line itself.
    assert slurm.SbatchRequest.from_json(line).render() == line


def test_paths_and_lists_are_kept_as_the_line_holds_them():
    request = slurm.SbatchRequest(script=Path("impl/run.sub"), exclude=["b", "a", "b"], output=Path("a_1/x.out"))
    assert (request.script, request.exclude, request.output) == ("impl/run.sub", ("a", "b"), "a_1/x.out")
    assert request == slurm.SbatchRequest(script="impl/run.sub", exclude=("a", "b"), output="a_1/x.out")


def test_a_request_refuses_what_sbatch_would():
    with pytest.raises(ValueError, match="nodes"):
        slurm.SbatchRequest(script="run.sub", nodes=0)
    with pytest.raises(ValueError, match="time_minutes"):
        slurm.SbatchRequest(script="run.sub", time_minutes=0)
    with pytest.raises(ValueError, match="not an sbatch line"):
        slurm.SbatchRequest.from_argv(["srun", "x"])


def test_the_signal_field_is_off_unless_set():
    request = slurm.SbatchRequest(script="run.sub", nodes=1)
    assert request.signal is None and not any(a.startswith("--signal") for a in request.render())
    with_signal = dataclasses.replace(request, signal="B:USR1@120")
    assert with_signal.render() == [*HEAD, "--nodes=1", "--signal=B:USR1@120", "run.sub"]
    assert slurm.SbatchRequest.from_argv(with_signal.render()) == with_signal
