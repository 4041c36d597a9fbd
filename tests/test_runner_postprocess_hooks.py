"""What `on_postprocess_trajectory` is shown, and what its in-place edits reach."""

from __future__ import annotations

from typing import Any

import numpy as np

from marl_runner import Callbacks, EnvRunner
from tests.runner_helpers import config


class ShapingHook(Callbacks):
    """Records the reward sums it is shown, then sets its own trajectory's rewards."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, float, dict]] = []

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        own = kwargs["postprocessed_batch"]
        others = {
            agent: float(np.sum(batch["rewards"]))
            for agent, (_, batch) in kwargs["original_batches"].items()
        }
        self.seen.append((kwargs["agent_id"], float(np.sum(own["rewards"])), others))
        own["rewards"][:] = 1000.0


def test_an_in_place_edit_reaches_the_batch_but_not_other_agents_original_batches() -> None:
    hook = ShapingHook()
    cfg = config("tests.envs:CheapEnv", num_envs=1, rollout_fragment_length=4,
                 env_config={"num_agents": 3})
    with EnvRunner(cfg, callbacks=hook) as runner:
        batch = runner.sample()
    shared = batch.policy_batches["shared"]
    np.testing.assert_array_equal(shared["rewards"], 1000.0)
    sampled = {agent: own for agent, own, _ in hook.seen}
    assert len(sampled) == 3
    for agent, _, others in hook.seen:
        assert others == {other: sampled[other] for other in sampled if other != agent}
        assert 1000.0 * 4 not in others.values()
