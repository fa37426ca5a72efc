"""Tools that set the Triton launch heuristic on a GPU: the launch-parameter sweep
(``sweep``) and the same-process A/B of launch variants (``ab``)."""
