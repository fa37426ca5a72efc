"""``python -m attngroup.reports``: see attngroup.reports.cli."""

import sys

from attngroup.reports.cli import main

sys.exit(main())
