"""Regression reports: run records, baseline comparison, self-contained HTML.

This package stands apart from the engine and the suites: it reads and writes JSON
run records (written by the pytest plugin in ``attngroup.reports.pytest_plugin``) and the JSON of
``python -m attngroup.ci select --json``; it imports neither ``suites`` nor ``reference_engine``.
"""
