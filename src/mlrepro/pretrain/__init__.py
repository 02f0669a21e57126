"""GPT pretraining runs: Megatron-LM launch lines, training-log scoring, chained segments."""
