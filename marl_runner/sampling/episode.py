"""One sub-env episode: which agents take part, their policies, and their rewards."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import chain
from operator import itemgetter
from time import perf_counter
from typing import Any

from marl_runner.envs.errors import EnvError
from marl_runner.sampling.rewards import RewardLedger


class AgentSlot:
    """An agent's place in one episode; ``key`` names its trajectory in the runner's tables."""

    __slots__ = ("agent_id", "policy_id", "index", "key", "done")

    def __init__(self, agent_id: Any, policy_id: str, index: int, key: int) -> None:
        self.agent_id = agent_id
        self.policy_id = policy_id
        self.index = index
        self.key = key
        self.done = False


class LayoutShape:
    """Which agents observe, grouped by policy, with one C-level reader per group.

    ``rows_of(dicts)`` iterates the group's values out of several ``agent_id ->
    value`` dicts, in C (KeyError if one is missing). Interned: sub-envs whose
    agents are grouped alike share one, so a round can read all of their rows
    at once.
    """

    __slots__ = ("groups", "agent_set")

    def __init__(self, groups: tuple[tuple[str, tuple], ...]) -> None:
        self.groups = tuple((pid, ids, _rows_of(ids)) for pid, ids in groups)
        self.agent_set = frozenset(a for _, ids in groups for a in ids)


_SHAPES: dict[tuple, LayoutShape] = {}
# Distinct groupings are few in practice; envs that spawn fresh agent ids could make many.
_MAX_SHAPES = 4096


def layout_shape(groups: tuple[tuple[str, tuple], ...]) -> LayoutShape:
    """The interned ``LayoutShape`` of ``((policy_id, agent_ids), ...)``."""
    shape = _SHAPES.get(groups)
    if shape is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        shape = _SHAPES[groups] = LayoutShape(groups)
    return shape


class EpisodeLayout:
    """Agents that observe in a round, grouped by policy, and their trajectory keys.

    When a later round has exactly these agents observing, none done and no
    held rewards, their rows are copied a whole policy group at a time (a
    parallel env's rounds repeat one layout; a turn-based env's alternate).
    """

    __slots__ = ("shape", "group_keys")

    def __init__(self, groups: dict[str, tuple[list, list]]) -> None:
        """``groups``: ``policy_id -> (agent ids, trajectory keys)``."""
        # List comprehensions, not generators: made for every new layout of every episode.
        self.shape = layout_shape(tuple([(pid, tuple(ids)) for pid, (ids, _) in groups.items()]))
        self.group_keys = tuple([tuple(keys) for _, keys in groups.values()])


def _rows_of(agent_ids: tuple) -> Callable[[Iterable[dict]], Iterable]:
    """``dicts -> d[a] for d in dicts for a in agent_ids``, all in C."""
    if len(agent_ids) == 1:
        return partial(map, itemgetter(agent_ids[0]))
    values_of = itemgetter(*agent_ids)
    return lambda dicts: chain.from_iterable(map(values_of, dicts))


class MultiAgentEpisode:
    """Bookkeeping for one episode of one sub-env.

    ``map_agent(agent_id, episode)`` is the runner's policy mapping (user fn
    plus the check that the result is a known policy id); the result is
    cached per agent until asked for with ``refresh=True``.
    """

    def __init__(
        self,
        episode_id: int,
        env_id: int,
        map_agent: Callable[[Any, MultiAgentEpisode], str],
        live_reward_totals: Callable[[MultiAgentEpisode], dict[Any, float]] | None = None,
        start_step: int = 0,
    ) -> None:
        self.episode_id = episode_id
        self.env_id = env_id
        self.length = 0
        # Env steps its sub-env had made when the episode was created (see env_t).
        self.start_step = start_step
        self.custom_metrics: dict[str, float] = {}
        self.hist_data: dict[str, list] = {}
        self.user_data: dict[str, Any] = {}
        self.media: dict[str, Any] = {}
        self.faulty = False
        self.started = False
        # False: played and counted in the metrics, but no row of it reaches a batch.
        self.training_enabled = True
        self.start_time = perf_counter()
        self.slots: dict[Any, AgentSlot] = {}
        # Layouts by the agents that observe (in obs order), made by the general path; a
        # round whose obs agents match one takes the fast path. Cleared when an agent is done.
        self.layouts: dict[tuple, EpisodeLayout] = {}
        self.rewards = RewardLedger()
        self._live_reward_totals = live_reward_totals
        # Env steps of this episode not yet built into a fragment.
        self.unbuilt_steps = 0
        # Raw obs of the last round each agent observed (only kept for ``fake_obs: last``).
        self.last_raw_obs: dict[Any, Any] = {}
        self._map_agent = map_agent
        self._policy_cache: dict[Any, str] = {}
        # ``str(agent_id) -> agent_id``, kept once an id that is not a str shows up.
        self._names: dict[str, Any] | None = None

    def policy_for(self, agent_id: Any, refresh: bool = False) -> str:
        """The agent's policy id, mapped once per episode unless ``refresh``."""
        if not refresh:
            cached = self._policy_cache.get(agent_id)
            if cached is not None:
                return cached
        policy_id = self._map_agent(agent_id, self)
        self._policy_cache[agent_id] = policy_id
        return policy_id

    def claim_name(self, agent_id: Any) -> None:
        """Refuses a new agent whose id reads as text like another agent's (``0`` and
        ``'0'``): the batch's ``agent_id`` column and episode files hold ids as text,
        where the two would be one agent. Str ids that differ read differently, so the
        names are kept only once an id of another type shows up in the episode."""
        names = self._names
        if names is None:
            if type(agent_id) is str:
                return
            names = self._names = {str(other): other for other in self.slots}
        name = str(agent_id)
        if name in names:  # the agent has no slot yet: the name's holder is another agent
            raise EnvError(
                f"sub-env {self.env_id}: agents {names[name]!r} and {agent_id!r} are different "
                f"agents whose ids read the same as text ({name!r}), as the batch's agent_id "
                "column and episode files hold them: give the env's agents ids that differ "
                "as text"
            )
        names[name] = agent_id

    def get_agents(self) -> list:
        """Agents that have observed in this episode, in order of appearance."""
        return list(self.slots)

    def agent_index(self, agent_id: Any) -> int:
        """The agent's index in this episode (order of first obs): the batches' ``agent_index``."""
        return self.slots[agent_id].index

    def is_done(self, agent_id: Any) -> bool:
        """Whether the agent's last transition has been closed (it gets no more rows)."""
        slot = self.slots.get(agent_id)
        return slot is not None and slot.done

    @property
    def agent_rewards(self) -> dict[tuple[Any, str | None], float]:
        """Every reward the env gave so far per (agent, policy). An agent that never
        observed (a poker player whose opponent folded first) has no row in any batch, but
        its reward counts under the policy it maps to."""
        slots = self.slots
        totals = self._totals()
        # One pass per dict (this runs once per ended episode): totals in their order, then
        # observed agents the env never rewarded.
        rewards = {}
        for agent_id, total in totals.items():
            slot = slots.get(agent_id)
            rewards[agent_id, self.policy_for(agent_id) if slot is None else slot.policy_id] = total
        if not slots.keys() <= totals.keys():
            for agent_id, slot in slots.items():
                if agent_id not in totals:
                    rewards[agent_id, slot.policy_id] = 0.0
        return rewards

    @property
    def total_reward(self) -> float:
        """Everything the env gave all agents so far (late rewards included)."""
        return float(sum(self._totals().values()))

    @property
    def num_late_rewards(self) -> int:
        """Rewards that came after their agent's final transition was handed out."""
        return self.rewards.num_late_rewards

    def _totals(self) -> dict[Any, float]:
        live = self._live_reward_totals(self) if self._live_reward_totals is not None else {}
        return self.rewards.totals_with(live)

    def __repr__(self) -> str:
        return (
            f"MultiAgentEpisode(id={self.episode_id}, env_id={self.env_id}, "
            f"length={self.length}, agents={len(self.slots)})"
        )
