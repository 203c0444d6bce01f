"""``python -m agentvfs``: the ``agentvfs`` command."""

import sys

from .cli import main

sys.exit(main())
