"""Launching one seed: its plan, and the local and Slurm backends that run it."""
