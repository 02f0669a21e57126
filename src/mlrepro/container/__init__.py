"""The container image a benchmark runs in: building it and recording what was built."""
