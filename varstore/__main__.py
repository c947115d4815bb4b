"""``python -m varstore``: the same command line as the ``varstore`` console script."""

import sys

from .cli import main

sys.exit(main())
