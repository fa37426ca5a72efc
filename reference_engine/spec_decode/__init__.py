"""Speculative decoding: drafting through the model runner and acceptance statistics."""
