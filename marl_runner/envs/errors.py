"""The one error type of the envs package."""

from __future__ import annotations


class EnvError(ValueError):
    """An env could not be built, or it broke the MultiAgentEnv contract.

    A ValueError so that code validating a whole config can catch env problems
    together with other bad values; the message always names the env (or
    sub-env) and what was expected.
    """


class SubEnvTimeoutError(EnvError):
    """A sub-env's step or reset took longer than `sub_env_step_timeout_s`.

    It is that sub-env's failure entry in `poll` (its worker was killed), so
    that a hung simulator costs one episode, not the run.
    """
