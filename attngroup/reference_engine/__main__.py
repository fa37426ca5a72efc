"""``python -m attngroup.reference_engine``: see attngroup.reference_engine.cli.main."""

from attngroup.reference_engine.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
