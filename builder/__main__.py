"""``python -m builder``; see builder/cli.py."""

import sys

from builder.cli import main

if __name__ == "__main__":
    sys.exit(main())
