"""GPU benchmarks of the attention backends (``python -m attngroup.benchmarks.bench_attention``)."""
