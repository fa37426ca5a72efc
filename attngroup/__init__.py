"""Attention-grouping conformance suite and CI harness: the project's one import package.

Subpackages: ``reference_engine`` (grouping API and engine), ``kernels`` (attention backends),
``suites`` (conformance tests), ``ci`` (test areas, selection, dependency checks), ``reports``
(run records and HTML), ``benchmarks`` (GPU timing), ``bugzoo`` (replayed bugs)."""
