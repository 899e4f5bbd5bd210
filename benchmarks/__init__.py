"""Benchmarks of the dispatcher's hot paths (run as modules, e.g. `python -m benchmarks.core_bench`)."""
