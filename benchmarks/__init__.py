"""Benchmarks of the dispatcher's hot paths (`python -m benchmarks.core_bench`)."""
