"""`python -m cli`: the `chatlens` command without its console script (how the demo starts its children)."""

import sys

from cli.main import main

sys.exit(main())
