"""Triton ops behind the backends: the unified attention kernel, its launch plan and the KV-cache write."""
