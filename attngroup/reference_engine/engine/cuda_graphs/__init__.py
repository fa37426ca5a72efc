"""CUDA-graph capture of the engine step: the per-group capture plan, the captured steps and the
model runner's graph pool."""
