"""The error types of the envs package: EnvError and the failures a runner tells apart."""

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


class SubEnvGoneError(EnvError):
    """A sub-env that cannot step or reset again until it is recreated: its worker
    process or Ray actor is gone.

    With `restart_failed_sub_environments` off, the runner raises it at the sub-env's
    next reset instead of retrying a reset that cannot succeed.
    """


class EpisodeFault(EnvError):
    """One episode failed, but its sub-env is fine: drop the episode and reset the sub-env.

    Unlike any other exception in place of a sub-env's obs, it is neither a
    reason to restart the sub-env nor to raise when restarts are off, and it
    does not count towards `max_consecutive_step_failures`: e.g. an external
    client that went quiet.
    """
