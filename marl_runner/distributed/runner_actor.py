"""The body of a remote runner: an EnvRunner inside a Ray actor.

`EnvRunnerGroup` wraps this class with `ray.remote` itself (with the CPUs it
asks for), so this module needs no Ray and the class stays plain Python.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from marl_runner.distributed.filter_states import (
    FilterStates,
    install_filter_states,
    pop_filter_deltas,
    read_filter_states,
)


class RunnerActor:
    """Holds one EnvRunner; each `sample` also hands back the metrics of that sample,
    so that they reach the driver even if the runner dies later."""

    def __init__(self, config: Any, runner_kwargs: dict[str, Any]) -> None:
        """Build the runner from the group's config (its seed already set per runner)."""
        # Inside the actor: torch is imported there only.
        from marl_runner.sampling.runner import EnvRunner

        self.runner = EnvRunner(config, **runner_kwargs)

    def ready(self) -> bool:
        """Answers once `__init__` is done, so the group sees a runner that cannot be
        built (bad env, missing module on that machine) before it samples."""
        return True

    def sample(self, sample_kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """`(batch, metrics)`: one `EnvRunner.sample` and the metrics of exactly that
        sample, in one reply, so no metrics are lost or counted twice if the actor dies."""
        batch = self.runner.sample(**sample_kwargs)
        return batch, self.runner.get_metrics()

    def flush(self) -> tuple[Any, dict[str, Any]]:
        """`(batch, metrics)` of `EnvRunner.flush`, as `sample` replies: the end of a run."""
        return self.runner.flush(), self.runner.get_metrics()

    def get_weights(self) -> dict[str, Any]:
        """The policies' weights; the group starts every runner from runner 1's when it
        has no local runner."""
        return self.runner.get_weights()

    def set_weights(self, weights: dict[str, Any]) -> None:
        """Install the weights the group put in the object store once for all runners."""
        # Arrays from the object store are read-only views; the policy gets its own copy.
        self.runner.set_weights(copy.deepcopy(weights))

    def pop_filter_deltas(self) -> FilterStates:
        """What this runner's observation filters saw since the last sync, for the
        group to merge exactly with the other runners' (a new delta starts)."""
        return pop_filter_deltas(self.runner)

    def read_filter_states(self) -> FilterStates:
        """The statistics the filters normalise with now: the group's starting point
        when it has no local runner."""
        return read_filter_states(self.runner)

    def install_filter_states(self, states: FilterStates) -> None:
        """Normalise with the group's merged statistics from now on (episodes go on)."""
        install_filter_states(self.runner, states)

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(runner, *args)` here, for `EnvRunnerGroup.foreach_runner`: anything the
        group has no method for, without a new actor method each time."""
        return fn(self.runner, *args)

    def stop(self) -> None:
        """Close the sub-envs (worker processes, Ray sub-env actors) so that their `close`
        runs: the `ray.kill` the group sends next ends the actor without it."""
        self.runner.stop()
