import sys

from attngroup.ci.cli import main

sys.exit(main())
