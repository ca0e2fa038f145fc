"""python -m fastloader <command>: the command line is fastloader/tools/cli.py."""
from __future__ import annotations

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
