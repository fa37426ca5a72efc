"""The dependency checker (``check-deps``): tests that reach a changed file through imports,
registry strings or recorded coverage, and steps whose ``source_file_dependencies`` miss it."""
