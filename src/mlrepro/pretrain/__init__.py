"""Pretraining runs: checkpoint retention, time-limited segments chained into one seed, live progress."""
