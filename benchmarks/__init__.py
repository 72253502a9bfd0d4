"""Benchmarks: each prints ratios and errors with the machine's load beside them
(``python -m benchmarks.<name> --help``); none is a test."""
