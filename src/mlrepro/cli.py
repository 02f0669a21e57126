"""The `mlrepro` command: one subcommand per module, which is imported only when its subcommand is used.

Each module listed in COMMANDS exposes `add_arguments(parser)` and `run(args) -> int`;
it is imported only when its subcommand is used, so `mlrepro --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import mlrepro

COMMANDS = {
    "score": ("mlrepro.scoring.cli", "score MLPerf logs (files or folders) as MLCommons would"),
    "status": ("mlrepro.status", "show each seed's state for a results/<benchmark> folder"),
    "nodes": ("mlrepro.slurm.node_health", "list the nodes a reproduction keeps out of its seeds, or clear one after repair"),
    "cluster": ("mlrepro.slurm.testcluster", "start, stop or show a local Slurm cluster on this machine"),
    "plan": ("mlrepro.kinds.plan_trial", "choose TP/PP/CP/DP, batch and recompute for a benchmark or GPT size on a system"),
    "preflight": ("mlrepro.preflight.run", "check this node (versions, GPUs, topology, all_reduce, matmul) and write preflight.json"),
    "baseline": ("mlrepro.baseline.run", "measure the portable GPT probe (PyTorch only): TFLOP/s, MFU, memory vs the planner's"),
    "preprocess": ("mlrepro.corpus.preprocess", "tokenize jsonl into Megatron's .bin/.idx (preprocess_data.py's flags)"),
    "profiles": ("mlrepro.profiles", "install the repository's Snakemake profiles as named ones (--profile local|slurm)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlrepro", description=mlrepro.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
