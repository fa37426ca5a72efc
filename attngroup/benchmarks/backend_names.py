"""The backends an attention benchmark run times, and the error bound every timed case
must meet. Metric names (``CASE.BACKEND.MEASURE``) and run records read these too, so
they live apart from the benchmark that times them."""

PEERS = ("flashinfer", "vllm-triton")
BACKENDS = ("triton", *PEERS)
MAX_RELATIVE_ERROR = 2e-2
