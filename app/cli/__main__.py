"""``python -m app.cli``: the same as the ``knobtune`` command."""

import sys

from app.cli import main

sys.exit(main())
