"""Baseline: mlrepro's portable GPT probe (nothing but PyTorch), measured against the datasheet peak and the planner's memory model."""
