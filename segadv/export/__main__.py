"""``python -m segadv.export``: the same as ``segadv-export``."""

import sys

from segadv.cli.export import main

sys.exit(main())
