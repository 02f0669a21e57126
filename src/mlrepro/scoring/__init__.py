"""Scoring MLPerf logs: parsing, rules, checkers, the score, the verdict, the reports and the submission package."""
