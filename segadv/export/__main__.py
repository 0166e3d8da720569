"""``python -m segadv.export``: the same as ``segadv-export``."""

import sys

from segadv.export.cli import main

sys.exit(main())
