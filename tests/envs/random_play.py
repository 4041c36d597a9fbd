"""Drive envs with random legal actions: a check for users' own envs, and
the workhorse of tests and env benchmarks.

`play_episode` plays one MultiAgentEnv episode while checking its contract;
`play_vector_env` drives a vector env the way a runner does. Both return
what happened, so reward totals and obs sequences can be compared across
wrappers, seeds and vector envs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.base_env import BaseEnv, EnvID, PollDicts
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv


@dataclass
class EpisodeRecord:
    """What one episode handed out.

    `rewards` sums every reward per agent; `steps` lists each round's
    `(obs, rewards, terminateds, truncateds, infos)` (round 0 is the reset,
    with empty rewards and flags).
    """

    rewards: dict[AgentID, float] = field(default_factory=dict)
    steps: list[tuple[MultiAgentDict, ...]] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Steps taken, not counting the reset in `steps[0]`, as the runner counts them."""
        return len(self.steps) - 1


def action_mask(obs: Any, info: dict[str, Any] | None) -> np.ndarray | None:
    """The agent's action mask (1 = allowed) from its Dict obs or its info, if any."""
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.asarray(obs["action_mask"])
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"])
    return None


def random_action(space: gym.Space, mask: np.ndarray | None, rng: np.random.Generator) -> Any:
    """A uniformly random action of `space`, restricted to `mask` if given."""
    if isinstance(space, gym.spaces.Discrete):
        allowed = np.flatnonzero(mask) if mask is not None else ()
        index = rng.choice(allowed) if len(allowed) else rng.integers(space.n)
        return int(space.start + index)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (space.start + rng.integers(space.nvec)).astype(space.dtype)
    space.seed(int(rng.integers(2**31)))  # other spaces: their own sampler, seeded from rng
    return space.sample()


def play_episode(
    env: MultiAgentEnv, seed: int | None = None, max_steps: int = 100_000, rng_seed: int = 0
) -> EpisodeRecord:
    """Reset `env` with `seed` and act randomly until `"__all__"` ends the episode.

    Every agent with a live obs acts in the next round (an empty action dict
    when none has). Raises EnvError when the env breaks the MultiAgentEnv
    contract: malformed returns, a missing `"__all__"`, or an obs for an
    agent that already ended.
    """
    rng = np.random.default_rng(rng_seed)
    name = type(env).__name__
    reset_result = env.reset(seed=seed)
    if not (isinstance(reset_result, tuple) and len(reset_result) == 2):
        raise EnvError(
            f"{name}.reset returned {type(reset_result).__name__}; expected (obs, infos)"
        )
    obs, infos = reset_result
    record = EpisodeRecord(steps=[(obs, {}, {}, {}, infos)])
    ended: set[AgentID] = set()
    acting = {agent for agent in obs}
    for _ in range(max_steps):
        actions = {
            agent: random_action(
                env.get_action_space(agent), action_mask(obs[agent], infos.get(agent)), rng
            )
            for agent in acting
        }
        result = env.step(actions)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise EnvError(f"{name}.step returned {type(result).__name__}; expected 5 dicts")
        obs, rewards, terminateds, truncateds, infos = result
        record.steps.append(result)
        if "__all__" not in terminateds or "__all__" not in truncateds:
            raise EnvError(f"{name}.step: '__all__' missing in terminateds or truncateds")
        for agent, reward in rewards.items():
            record.rewards[agent] = record.rewards.get(agent, 0.0) + float(reward)
        revived = ended.intersection(obs)
        if revived:
            raise EnvError(f"{name}.step: obs for agents {sorted(revived)} that already ended")
        if terminateds["__all__"] or truncateds["__all__"]:
            return record
        done = {a for a in obs if terminateds.get(a) or truncateds.get(a)}
        ended |= done
        acting = {agent for agent in obs if agent not in done}
    raise EnvError(f"{name}: episode did not end within {max_steps} steps")


def play_vector_env(
    vector_env: BaseEnv, num_rounds: int, rng_seed: int = 0, max_reset_tries: int = 3
) -> list[tuple[PollDicts, dict[EnvID, tuple[MultiAgentDict | Exception, MultiAgentDict]]]]:
    """Drive a vector env like a runner would, with random legal actions.

    Each round polls, resets every sub-env whose episode ended (or crashed)
    with `try_reset` (retrying failed resets), and sends actions for every
    agent with a live obs, an empty dict for a sub-env without one. Returns
    per round the poll and the `(obs, infos)` of the resets done in it, so
    two vector envs can be compared round by round. Asynchronous resets
    (`try_reset` returning None) are not supported.
    """
    rng = np.random.default_rng(rng_seed)
    history = []
    for _ in range(num_rounds):
        poll = vector_env.poll()
        obs, _, terminateds, truncateds, infos, _ = poll
        resets: dict[EnvID, tuple[MultiAgentDict | Exception, MultiAgentDict]] = {}
        actions: dict[EnvID, MultiAgentDict] = {}
        for env_id, env_obs in obs.items():
            env_infos = infos[env_id]
            done_flags: dict[AgentID, Any] = {}
            if terminateds[env_id]["__all__"] or truncateds[env_id]["__all__"]:
                for _ in range(max_reset_tries):
                    reset = vector_env.try_reset(env_id)
                    if reset is None:
                        raise EnvError("play_vector_env does not support asynchronous resets")
                    resets[env_id] = reset
                    env_obs, env_infos = reset
                    if not isinstance(env_obs, Exception):
                        break
                else:
                    raise EnvError(f"sub-env {env_id}: {max_reset_tries} resets in a row failed")
            else:
                done_flags = {
                    agent: terminateds[env_id].get(agent) or truncateds[env_id].get(agent)
                    for agent in env_obs
                }
            actions[env_id] = {
                agent: random_action(
                    vector_env.get_action_space(agent),
                    action_mask(agent_obs, env_infos.get(agent)),
                    rng,
                )
                for agent, agent_obs in env_obs.items()
                if not done_flags.get(agent)
            }
        vector_env.send_actions(actions)
        history.append((poll, resets))
    return history
