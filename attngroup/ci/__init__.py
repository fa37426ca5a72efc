"""CI harness: vLLM-style test areas, change-based step selection, Buildkite emission and a
dependency-gap checker. Stands apart from the engine packages: it reads YAML and source text only.
"""
