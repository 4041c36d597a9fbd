"""User code for the runner-with-connectors tests, named by ``module:attr`` paths in configs.

pytest puts ``tests/`` on ``sys.path``, so a config (or a YAML file) names
these as ``helpers_runner_connectors:TagRowsConnector`` and so on, exactly as
a user would name their own module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from connectors import (
    ActionConnectorDataType,
    AgentConnector,
    AgentConnectorDataType,
    ConnectorContext,
    MeanStdObservationFilterAgentConnector,
)
from marl_runner import EnvRunner, RunnerConfig
from marl_runner.policy.torch_policy import TorchPolicy
from tests.envs import BoxActionEnv

KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"
KAZ_MAPPING = {"archer_*": "archer", "knight_*": "knight"}
FILTER = "MeanStdObservationFilterAgentConnector"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny forward passes: extra intra-op threads only add contention (~8x slower on 2 CPUs).

    Test modules use it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``
    after importing it.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def kaz(max_cycles: int = 30) -> dict[str, Any]:
    """Knights-Archers-Zombies with vector observations (135 floats per agent)."""
    return {"name": KAZ, "config": {"max_cycles": max_cycles, "obs_method": "vector"}}


def config(env: dict[str, Any], policies: dict[str, Any], **overrides: Any) -> RunnerConfig:
    """2 sync sub-envs, fragments of 10 env steps, unless overridden."""
    return RunnerConfig.from_dict(
        {
            "env": env,
            "num_envs": 2,
            "rollout_fragment_length": 10,
            "policies": policies,
            **overrides,
        }
    )


def filter_of(runner: EnvRunner, policy_id: str) -> MeanStdObservationFilterAgentConnector:
    return runner.policy_map[policy_id].agent_connectors[FILTER]


def filtered_kaz_config(**overrides: Any) -> RunnerConfig:
    """KAZ with an LSTM archer policy and an MLP knight policy, both behind a MeanStd filter."""
    chain = ["ObsPreprocessorConnector", FILTER, "StateBufferConnector"]
    policies = {
        "archer": {
            "model": {"type": "lstm", "hidden": [16], "lstm_cell_size": 8},
            "agent_connectors": chain,
        },
        "knight": {"model": {"type": "mlp", "hidden": [16]}, "agent_connectors": chain},
    }
    return config(kaz(max_cycles=40), policies, policy_mapping_fn=KAZ_MAPPING, **overrides)


def assert_same_policies(a: EnvRunner, b: EnvRunner) -> None:
    """Equal weights, connector chains and filter statistics, policy by policy."""
    state_a, state_b = a.get_state(), b.get_state()
    assert set(state_a) == set(state_b)
    for pid in state_a:
        assert state_a[pid]["agent_connectors"] == state_b[pid]["agent_connectors"]
        assert state_a[pid]["action_connectors"] == state_b[pid]["action_connectors"]
        assert state_a[pid]["weights"].keys() == state_b[pid]["weights"].keys()
        for name, weight in state_a[pid]["weights"].items():
            np.testing.assert_array_equal(weight, state_b[pid]["weights"][name])
        if FILTER in a.policy_map[pid].agent_connectors:
            assert filter_of(a, pid).get_state() == filter_of(b, pid).get_state()


def perturbed_weights(runner: EnvRunner) -> dict[str, Any]:
    """Weights unlike a fresh runner's, so that restoring them is visible."""
    return {
        pid: {name: w + 0.01 for name, w in weights.items()}
        for pid, weights in runner.get_weights().items()
    }


class TagRowsConnector(AgentConnector):
    """A per-item user connector: adds column ``user_tag`` and scales ``rewards``."""

    def __init__(self, ctx: ConnectorContext, tag: float = 1.0, reward_scale: float = 1.0) -> None:
        super().__init__(ctx)
        self.tag = float(tag)
        self.reward_scale = float(reward_scale)

    def params(self) -> dict[str, Any]:
        return {"tag": self.tag, "reward_scale": self.reward_scale}

    def transform(self, item: AgentConnectorDataType) -> AgentConnectorDataType:
        item.data["user_tag"] = np.float32(self.tag)
        item.data["rewards"] = np.float32(item.data["rewards"] * self.reward_scale)
        return item


def double_rewards(item: AgentConnectorDataType) -> AgentConnectorDataType:
    """For ``LambdaAgentConnector``: rewards times two."""
    item.data["rewards"] = np.float32(2.0 * item.data["rewards"])
    return item


def halve_actions(item: ActionConnectorDataType) -> ActionConnectorDataType:
    """For ``LambdaActionConnector``: env-bound actions times one half."""
    action, state_outs, extra = item.output
    item.output = (np.asarray(action) * np.float32(0.5), state_outs, extra)
    return item


class RecordingBoxEnv(BoxActionEnv):
    """``BoxActionEnv`` with chosen bounds that records every action it is sent.

    ``received`` holds one ``{agent: action}`` dict per ``step`` call, the
    action objects exactly as the env got them. Like ``BoxActionEnv`` it
    rejects actions outside its box.
    """

    def __init__(self, low: float = -1.0, high: float = 1.0, episode_len: int = 5) -> None:
        super().__init__(episode_len=episode_len)
        space = gym.spaces.Box(float(low), float(high), (2,), np.float32)
        self.action_spaces = dict.fromkeys(self.possible_agents, space)
        self.received: list[dict[Any, Any]] = []

    def step(self, actions: dict[Any, Any]) -> Any:
        self.received.append(dict(actions))
        return super().step(actions)


class CountingTorchPolicy(TorchPolicy):
    """A ``TorchPolicy`` that records each forward pass: rows, agents and RNN state inputs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[dict[str, Any]] = []

    def compute_actions_from_input_dict(self, input_dict: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(
            {
                "num_rows": len(input_dict["obs"]),
                "env_ids": np.asarray(input_dict["env_ids"]).copy(),
                "agent_ids": list(input_dict["agent_ids"]),
                "state_in_0": np.array(input_dict["state_in_0"])
                if "state_in_0" in input_dict
                else None,
            }
        )
        return super().compute_actions_from_input_dict(input_dict, *args, **kwargs)


class OffPolicyVectorEnv:
    """Wraps a vector env so that ``poll`` reports an off-policy action for every live agent.

    As an external env that logged its own actions would: the runner must
    store ``action`` (not the policy's) for those rows.
    """

    def __init__(self, inner: Any, action: Any = 0) -> None:
        self._inner = inner
        self._action = action

    def poll(self) -> tuple:
        obs, rewards, terminateds, truncateds, infos, off_policy = self._inner.poll()
        off_policy = dict(off_policy)
        for env_id, env_obs in obs.items():
            if isinstance(env_obs, BaseException):
                continue
            off_policy[env_id] = dict.fromkeys(env_obs, self._action)
        return obs, rewards, terminateds, truncateds, infos, off_policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
