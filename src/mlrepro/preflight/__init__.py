"""Preflight: prove a node is healthy (versions, GPUs, topology, collectives, compute) before GPU-hours are spent.

One module per job: versions, gpus, topology, collectives, compute, verdict, report; `run` puts
them together into results/preflight/<system>/preflight.json and env_checklist.md, `quick` is
the seconds-long subset every seed runs inside its allocation before training.
"""

NA = "not applicable"
