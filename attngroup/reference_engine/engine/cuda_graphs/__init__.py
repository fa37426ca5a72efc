"""CUDA-graph capture of the engine step: the per-group capture plan, the captured steps, the
model runner's graph pool, and the greedy speculative step kept on the device."""
