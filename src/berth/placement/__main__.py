"""``python -m berth.placement serve ...``: the same as ``berth placement serve``."""

from __future__ import annotations

import sys

from berth.placement.cli import main

if __name__ == "__main__":
    sys.exit(main())
