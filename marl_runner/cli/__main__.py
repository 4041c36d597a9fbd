"""``python -m marl_runner.cli``: the same as the ``marl-runner`` console script."""

import sys

from marl_runner.cli.app import main

sys.exit(main())
