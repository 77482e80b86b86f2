"""Benchmarks that print numbers: `python -m tokjax.lab.benchmarks.scaling` (step time and per-device
memory versus devices), `... throughput` (training throughput), `... prepared_data` (start-up time
and memory of the data pipeline against corpus size, results/data/)."""
