"""Slurm: the runtime client (sbatch, squeue, sacct) and, apart from it, the local test cluster."""
