"""The planner: which parallel layout to run a benchmark or a GPT size with on the GPUs you have.

models (shapes) -> workloads (training precision, batch rules, RCPs) -> memory and cost models
-> search (enumerate, then a pulp integer program selects) -> writer (config_<SYS>.sh or
Megatron-LM arguments). `mlrepro plan` is the command (plan/cli.py).
"""
