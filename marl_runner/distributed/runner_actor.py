"""The body of a remote runner: an EnvRunner inside a Ray actor."""

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
        from marl_runner import EnvRunner  # inside the actor: imports torch there only

        self.runner = EnvRunner(config, **runner_kwargs)

    def ready(self) -> bool:
        return True

    def sample(self, sample_kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        batch = self.runner.sample(**sample_kwargs)
        return batch, self.runner.get_metrics()

    def get_weights(self) -> dict[str, Any]:
        return self.runner.get_weights()

    def set_weights(self, weights: dict[str, Any]) -> None:
        # Arrays from the object store are read-only views; the policy gets its own copy.
        self.runner.set_weights(copy.deepcopy(weights))

    def pop_filter_deltas(self) -> FilterStates:
        return pop_filter_deltas(self.runner)

    def read_filter_states(self) -> FilterStates:
        return read_filter_states(self.runner)

    def install_filter_states(self, states: FilterStates) -> None:
        install_filter_states(self.runner, states)

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.runner, *args)

    def stop(self) -> None:
        self.runner.stop()
