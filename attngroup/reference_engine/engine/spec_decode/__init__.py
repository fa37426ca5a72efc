"""Speculative decoding: the drafters the model runner calls (one drafting
method per module, behind ``drafter.Drafter``), the engine-side proposer, the device
loop that keeps a greedy batch's steps on the device, and acceptance statistics."""
