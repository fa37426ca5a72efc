"""GPU benchmarks of the attention backends (``python -m benchmarks.bench_attention``)."""
