"""``python -m stockade``: the same as the ``stockade`` console script."""

import sys

from stockade.cli import main

sys.exit(main())
