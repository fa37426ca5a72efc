"""The reference engine's command line: ``pairs``, ``inspect`` and ``generate``."""
