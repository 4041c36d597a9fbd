"""The ``marl-runner`` command: ``sample``, ``validate``, ``serve``, ``evaluate``, ``plot``,
``bench`` and ``config-doc``.

One module per command, each with its ``add_*_parser`` and ``run_*``; ``app``
puts them together. What the commands share (exit codes, ``CommandError``,
config loading, what a failed runner build means, ``--out``, ``--metrics-out``)
is in ``common``, and the metrics table and end-of-run summary in ``display``.

Exit codes: 0 success; 1 a failure while sampling; 2 a bad command line or
a config that does not validate (including what it names: env, import paths,
mapping, spaces, so anything raised while the runner is built; ``validate``
and ``sample`` agree on it); 130 interrupted. Errors are one line on stderr;
``--traceback`` adds the full trace.
"""

from marl_runner.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
