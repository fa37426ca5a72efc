import sys

from ci.cli import main

sys.exit(main())
