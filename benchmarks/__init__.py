"""Benchmarks of the dispatcher; run each module with `python -m benchmarks.<name>`."""
