"""``python -m marl_runner.bench``: same as ``marl-runner bench``."""

import sys

from marl_runner.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
