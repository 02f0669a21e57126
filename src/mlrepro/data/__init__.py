"""Datasets and checkpoints: downloads (HTTP, Hub), expected-mounts checks, manifests, the data stage pipeline."""
