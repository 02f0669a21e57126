"""Pretraining runs: Megatron-LM plans, launch lines and log scoring; checkpointed segments chained into one seed; live progress."""
