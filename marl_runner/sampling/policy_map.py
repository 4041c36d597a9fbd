"""``PolicyMap``: the runner's policies, how agents map to them, and their state.

Policies are built from their specs with spaces taken from the env agents
mapped to them; a policy no known agent maps to is built when its first
agent appears (agents spawned later).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym

from marl_runner.mapping import AgentMapping, infer_policy_spaces
from marl_runner.policy import Policy
from marl_runner.policy_setup import PolicyEntry, build_entry
from marl_runner.sampling.episode import MultiAgentEpisode


class PolicyMap(Mapping[str, Policy]):
    """``policy_id -> Policy`` for the built policies, plus the specs of those not built yet.

    ``spaces_of(agent_id)`` gives an agent's (obs space, action space);
    ``possible_agents`` the agents known up front; ``mapping_context`` the
    keyword arguments the user's mapping fn may ask for (``runner``, ``worker``).
    """

    def __init__(
        self,
        specs: Mapping[str, Any],
        mapping_fn: Callable[..., str] | str | dict | None,
        *,
        possible_agents: list[Any],
        spaces_of: Callable[[Any], tuple[gym.Space, gym.Space]],
        runner_config: Any,
        mapping_context: dict[str, Any],
    ) -> None:
        self._specs: dict[str, Any] = dict(specs)
        self._possible_agents = possible_agents
        self._spaces_of = spaces_of
        self._config = runner_config
        self.entries: dict[str, PolicyEntry] = {}
        # Ready-made policies built before any agent mapped to them: their connectors
        # were built for the policy's own spaces, which may not be the env's.
        self._built_for_own_spaces: set[str] = set()
        # A live view: policies added later are valid mapping results too.
        self._mapping = AgentMapping(mapping_fn, self._specs.keys(), mapping_context)
        self._build_mapped(self._specs)

    # ---- Mapping[str, Policy]

    def __getitem__(self, policy_id: str) -> Policy:
        return self.entries[policy_id].policy

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"PolicyMap(built={list(self.entries)}, specs={list(self._specs)})"

    @property
    def policy_ids(self) -> list[str]:
        """Every known policy id, built or not."""
        return list(self._specs)

    # ---- mapping

    def map_agent(self, agent_id: Any, episode: MultiAgentEpisode) -> str:
        """The user's mapping (which checks that the result is a known policy id)."""
        return self._mapping(agent_id, episode)

    def set_mapping_fn(self, fn: Callable[..., str] | str | dict) -> None:
        """Agents mapped from now on use ``fn``."""
        self._mapping.replace(fn)

    # ---- building

    def entry_for(self, policy_id: str, agent_id: Any) -> PolicyEntry:
        """The policy's entry, built now with ``agent_id``'s spaces if it is not yet."""
        entry = self.entries.get(policy_id)
        if entry is None or policy_id in self._built_for_own_spaces:
            obs_space, act_space = self._spaces_of(agent_id)
            if entry is not None:
                self._built_for_own_spaces.discard(policy_id)
                if entry.original_observation_space == obs_space:
                    return entry
                # Same policy object (weights kept), connectors rebuilt for the agent's spaces.
                entry.policy.agent_connectors = entry.policy.action_connectors = None
            entry = self._build(policy_id, self._specs[policy_id], obs_space, act_space, agent_id)
        return entry

    def add(
        self, policy_id: str, spec: Policy | dict, mapping_fn: Callable[..., str] | str | dict | None
    ) -> Policy | None:
        """Adds a policy; returns it, or None when it waits for its first agent."""
        if policy_id in self._specs:
            raise ValueError(f"policy id {policy_id!r} already exists")
        self._specs[policy_id] = spec
        self._built_for_own_spaces.discard(policy_id)
        if mapping_fn is not None:
            self.set_mapping_fn(mapping_fn)
        self._build_mapped({policy_id: spec})
        entry = self.entries.get(policy_id)
        return None if entry is None else entry.policy

    def remove(self, policy_id: str) -> tuple[Any, PolicyEntry | None]:
        """Forgets the policy; returns its spec and entry, for ``restore`` if the removal fails."""
        if policy_id not in self._specs:
            raise KeyError(f"no policy {policy_id!r}; policies: {sorted(self._specs)}")
        return self._specs.pop(policy_id), self.entries.pop(policy_id, None)

    def restore(self, policy_id: str, removed: tuple[Any, PolicyEntry | None]) -> None:
        """Undoes ``remove``: the same spec and the same built policy (weights, connector state)."""
        spec, entry = removed
        self._specs[policy_id] = spec
        if entry is not None:
            self.entries[policy_id] = entry

    def _build_mapped(self, specs: Mapping[str, Any]) -> None:
        """Builds the given policies that known agents map to, or that declare their spaces."""
        # Mapping fns may read the episode (e.g. its id for self-play): give them one.
        probe = MultiAgentEpisode(episode_id=-1, env_id=-1, map_agent=self.map_agent)
        spaces = infer_policy_spaces(
            self._possible_agents,
            probe.policy_for,
            lambda agent_id: self._spaces_of(agent_id)[0],
            lambda agent_id: self._spaces_of(agent_id)[1],
        )
        for policy_id, spec in specs.items():
            if policy_id in spaces:
                obs_space, act_space, agent_id = spaces[policy_id]
                self._build(policy_id, spec, obs_space, act_space, agent_id)
            elif isinstance(spec, Policy) or (spec.get("observation_space") and spec.get("action_space")):
                self._build(policy_id, spec, None, None, None)
                if isinstance(spec, Policy):
                    self._built_for_own_spaces.add(policy_id)

    def _build(
        self, policy_id: str, spec: Any, obs_space: Any, act_space: Any, agent_id: Any
    ) -> PolicyEntry:
        """``agent_id``: one of the agents mapped to it (named in space errors), if known."""
        if isinstance(spec, Policy):
            obs_space = obs_space or spec.observation_space
            act_space = act_space or spec.action_space
        entry = build_entry(
            policy_id, spec, obs_space, act_space,
            seed=self._config.seed, runner_config=self._config, agent=agent_id,
        )
        self.entries[policy_id] = entry
        return entry

    # ---- state

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``policy_id -> (policy input obs space, action space)`` of the built policies."""
        return {
            pid: (e.policy.observation_space, e.policy.action_space) for pid, e in self.entries.items()
        }

    def get_weights(self) -> dict[str, Any]:
        """``policy_id -> weights`` of the built policies, to ship to other runners."""
        return {pid: e.policy.get_weights() for pid, e in self.entries.items()}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Loads weights for the named built policies; an unknown id raises ``KeyError``."""
        self._check_built(weights, "set_weights")
        for pid, w in weights.items():
            self.entries[pid].policy.set_weights(w)

    def get_state(self) -> dict[str, Any]:
        """Weights and both connector pipelines' state per built policy (checkpoints, syncing)."""
        return {
            pid: {
                "weights": e.policy.get_weights(),
                "agent_connectors": e.agent_pipeline.to_state(),
                "action_connectors": e.action_pipeline.to_state(),
            }
            for pid, e in self.entries.items()
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Takes ``get_state``'s result over in place (see ``EnvRunner.set_state``)."""
        self._check_built(state, "set_state")
        for pid, policy_state in state.items():
            entry = self.entries[pid]
            entry.policy.set_weights(policy_state["weights"])
            entry.agent_pipeline.set_state(policy_state["agent_connectors"])
            entry.action_pipeline.set_state(policy_state["action_connectors"])

    def pop_connector_timings(self) -> dict[str, dict[str, Any]]:
        """Per policy, each pipeline's connector timings since the last call (``connector_metrics``)."""
        return {
            pid: {"agent": e.agent_pipeline.pop_timings(), "action": e.action_pipeline.pop_timings()}
            for pid, e in self.entries.items()
        }

    def _check_built(self, per_policy: Mapping[str, Any], what: str) -> None:
        unknown = sorted(set(per_policy) - set(self.entries))
        if unknown:
            raise KeyError(f"{what}: no built policies {unknown}; policies: {sorted(self.entries)}")
