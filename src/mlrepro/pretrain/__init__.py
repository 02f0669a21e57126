"""Pretraining runs: Megatron-LM plans and launch lines; checkpointed segments chained into one seed; live progress."""
