"""mlrepro: reproduce MLPerf-style LLM training results end to end."""

__version__ = "0.1.0"
