"""Scoring training logs (MLPerf MLLOG and Megatron-LM/NeMo): parsing, rules, checkers, the score, the verdict,
the reports and the submission package."""
