"""The sbatch request (mlrepro.slurm.client.SbatchRequest) renders the line the earlier list functions built."""

from __future__ import annotations

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
def test_the_list_functions_print_the_recorded_lines(script, options, line, attempts):
    assert slurm.sbatch_command(script, **options) == line
    for where, expected in zip(ATTEMPTS, attempts or []):
        assert slurm.for_attempt(line, **where) == expected
