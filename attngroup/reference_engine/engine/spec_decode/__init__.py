"""Speculative decoding: the drafters the model runner calls (one drafting
method per module, behind ``drafter.Drafter``), the engine-side proposer and
acceptance statistics."""
