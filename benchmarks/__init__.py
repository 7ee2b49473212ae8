"""Benchmarks: each module has `run() -> dict`; `python -m benchmarks` runs them all."""
