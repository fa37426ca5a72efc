"""``python -m reports``: see reports.cli."""

import sys

from reports.cli import main

sys.exit(main())
