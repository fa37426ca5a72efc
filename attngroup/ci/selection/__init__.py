"""Which steps a change runs (vLLM's generator rules), the Buildkite pipeline that runs them, and
the pytest commands inside a step's commands."""
