"""``python -m benchmarks``: same as ``marl-runner bench``."""

import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
