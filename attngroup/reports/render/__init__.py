"""Rendering a comparison: the HTML report, its outcome matrix and trends, and the terminal summary."""
