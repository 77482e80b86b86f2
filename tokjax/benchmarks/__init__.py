"""Benchmarks: `python -m tokjax.benchmarks.scaling` (step time and per-device memory versus devices)."""
