"""The thread-safe meeting point of external episodes (client threads) and the runner.

Client threads add *steps* to their episode (an obs to act on, an off-policy
action, or the episode's end); the runner takes at most one step per slot
per round in `take_ready`, answers with `give_actions`, and frees the slot
in `free_slot` once the episode is over. A slot is a sub-env index of the
vector env: `num_envs` slots mean at most that many episodes at once.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marl_runner.envs.checks import LARGEST_REWARD
from marl_runner.envs.errors import EpisodeFault
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict

# How many finished episode ids are remembered, to tell "finished" from "unknown".
_FINISHED_MEMORY = 100_000


class ExternalEnvStopped(RuntimeError):
    """The runner serving an external env stopped; waiting and later calls raise this."""


class ExternalEpisodeTimeout(EpisodeFault):
    """An external episode's client was quiet longer than `external_episode_timeout_s`."""


class _Reply:
    """What one waiting `get_action` call receives: actions or an error, handed to `deliver`
    once (in the thread that answers: the runner's, or the one stopping it)."""

    __slots__ = ("deliver", "done")

    def __init__(self, deliver: Callable[[MultiAgentDict | None, BaseException | None], None]) -> None:
        self.deliver = deliver
        self.done = False


@dataclass
class Step:
    """One round of an external episode, as the runner's poll hands it out."""

    obs: MultiAgentDict
    rewards: MultiAgentDict
    infos: MultiAgentDict
    off_policy_actions: MultiAgentDict
    terminated: bool = False
    truncated: bool = False
    reply: _Reply | None = None


@dataclass
class _Episode:
    episode_id: Any
    slot: int
    last_call: float
    training_enabled: bool
    steps: deque[Step] = field(default_factory=deque)
    rewards: dict[AgentID, float] = field(default_factory=dict)
    infos: dict[AgentID, dict] = field(default_factory=dict)
    sent_any: bool = False  # a step has been queued (the runner knows the episode)
    ended: bool = False  # end_episode called (or timed out): no more client calls
    waiting: int = 0  # client calls blocked on a reply


class EpisodeBoard:
    """Episodes by id and by slot, the steps waiting for the runner, and the replies.

    One lock guards everything; client calls never hold it while waiting.

    Args:
        num_slots: episodes that may run at once (the vector env's `num_envs`).
        episode_timeout_s: an episode without a client call for this long (and
            nothing queued or waiting) is ended as faulty; `start_episode`
            waits at most this long for a free slot. None: no limit.
        batch_wait_s: once some step is ready, `take_ready` waits up to this
            long for the other running episodes, to batch more rows per
            forward pass.
    """

    def __init__(
        self, num_slots: int, episode_timeout_s: float | None, batch_wait_s: float = 0.0
    ) -> None:
        self.num_slots = num_slots
        self.episode_timeout_s = episode_timeout_s
        self.batch_wait_s = batch_wait_s
        self._lock = threading.Lock()
        self._data_ready = threading.Condition(self._lock)
        self._slot_freed = threading.Condition(self._lock)
        self._free_slots: deque[int] = deque(range(num_slots))
        self._episodes: dict[Any, _Episode] = {}  # running, by id
        self._by_slot: dict[int, _Episode] = {}  # running or ended but not yet consumed
        self._in_flight: dict[int, Step] = {}  # handed to the runner, waiting for actions
        self._finished: OrderedDict[Any, str] = OrderedDict()
        self._stopped: str | None = None
        self._id_counter = itertools.count()
        # While `take_ready` waits for the other episodes' steps (batch_wait_s): how many it
        # still waits for. A queued step wakes it only once that many came, not each time.
        self._awaited: int | None = None

    # ------------------------------------------------------------------ client side

    def start_episode(self, episode_id: Any = None, training_enabled: bool = True) -> Any:
        """Takes a free slot for a new episode (waiting for one) and returns the episode's id.

        Waits at most `episode_timeout_s` (`TimeoutError`), so a full server
        answers instead of holding the caller forever.
        """
        with self._lock:
            self._raise_if_stopped("start_episode")
            if episode_id is None:
                episode_id = f"{uuid.uuid4().hex}-{next(self._id_counter)}"
            elif episode_id in self._episodes:
                raise ValueError(f"start_episode: episode {episode_id!r} is already running")
            elif episode_id in self._finished:
                raise ValueError(f"start_episode: episode {episode_id!r} has already finished")
            ready = self._slot_freed.wait_for(
                lambda: self._free_slots or self._stopped, self.episode_timeout_s
            )
            self._raise_if_stopped("start_episode")
            if not ready:
                raise TimeoutError(
                    f"start_episode({episode_id!r}): all {self.num_slots} episode slots stayed "
                    f"busy for {self.episode_timeout_s}s (external_episode_timeout_s); raise "
                    "num_envs to run more episodes at once, or end episodes sooner"
                )
            if episode_id in self._episodes:  # started by another thread while we waited
                raise ValueError(f"start_episode: episode {episode_id!r} is already running")
            slot = self._free_slots.popleft()
            episode = _Episode(episode_id, slot, time.monotonic(), training_enabled)
            self._episodes[episode_id] = episode
            self._by_slot[slot] = episode
            return episode_id

    def get_action(self, episode_id: Any, obs: MultiAgentDict) -> MultiAgentDict:
        """Queues `obs` as the episode's next step and blocks until the runner's actions come.

        Waiting without the lock lets the runner batch this step with other
        episodes' steps into one forward pass.
        """
        done = threading.Event()
        answer: list = []

        def deliver(actions: MultiAgentDict | None, error: BaseException | None) -> None:
            answer[:] = [actions, error]
            done.set()

        self.request_action(episode_id, obs, deliver)
        done.wait()
        actions, error = answer
        if error is not None:
            raise error
        return actions

    def request_action(
        self,
        episode_id: Any,
        obs: MultiAgentDict,
        deliver: Callable[[MultiAgentDict | None, BaseException | None], None],
    ) -> None:
        """`get_action` without blocking: queues the step and returns; `deliver(actions, None)`
        or `deliver(None, error)` is called once, from the runner's thread (or the one that
        stops it), so an event loop can wait for many episodes without a thread each.

        Raises at once (nothing queued) for an unknown episode or a stopped runner.
        """
        with self._lock:
            episode = self._running(episode_id, "get_action")
            self._queue(episode, _check_obs(obs, episode_id, "get_action"), {}, reply=_Reply(deliver))
            episode.waiting += 1

    def log_action(self, episode_id: Any, obs: MultiAgentDict, actions: MultiAgentDict) -> None:
        """Queues a step whose actions the env chose itself; returns without waiting."""
        if not isinstance(actions, dict):
            raise ValueError(
                f"log_action({episode_id!r}): actions must be a dict agent_id -> action, "
                f"got {type(actions).__name__}"
            )
        with self._lock:
            episode = self._running(episode_id, "log_action")
            obs = _check_obs(obs, episode_id, "log_action")
            extra = [agent for agent in actions if agent not in obs]
            if extra:
                raise ValueError(
                    f"log_action({episode_id!r}): actions for agents {extra} that have no obs "
                    f"in this step; agents with an obs: {list(obs)}"
                )
            self._queue(episode, obs, dict(actions))

    def log_returns(
        self, episode_id: Any, rewards: MultiAgentDict, infos: MultiAgentDict | None = None
    ) -> None:
        """Adds rewards (and infos) to what the episode's next step carries.

        Rewards are checked, and their sums since the last step too, before
        anything is added: the batch stores them as float32, so a sum beyond
        float32 would become inf in every later computation.
        """
        if not isinstance(rewards, dict):
            raise ValueError(
                f"log_returns({episode_id!r}): rewards must be a dict agent_id -> float, "
                f"got {type(rewards).__name__}"
            )
        if infos is not None and not isinstance(infos, dict):
            raise ValueError(
                f"log_returns({episode_id!r}): infos must be a dict agent_id -> dict or None, "
                f"got {type(infos).__name__}"
            )
        bad_info = next(
            (a for a, info in (infos or {}).items() if info is not None and not isinstance(info, dict)),
            None,
        )
        if bad_info is not None:
            raise ValueError(
                f"log_returns({episode_id!r}): info of agent {bad_info!r} is a "
                f"{type(infos[bad_info]).__name__}; expected a dict or None"
            )
        values = {agent: _reward(agent, reward, episode_id) for agent, reward in rewards.items()}
        with self._lock:
            episode = self._running(episode_id, "log_returns")
            totals = {agent: episode.rewards.get(agent, 0.0) + r for agent, r in values.items()}
            for agent, total in totals.items():
                _check_reward(agent, total, episode_id, "add up to")
            episode.rewards.update(totals)
            for agent, info in (infos or {}).items():
                episode.infos.setdefault(agent, {}).update(info or {})
            episode.last_call = time.monotonic()

    def end_episode(self, episode_id: Any, obs: MultiAgentDict, truncated: bool = False) -> None:
        """Ends the episode with its final obs; its slot frees once the runner consumed it.

        An episode the runner never saw frees its slot at once.
        """
        with self._lock:
            episode = self._running(episode_id, "end_episode")
            obs = _check_obs(obs, episode_id, "end_episode", allow_empty=True)
            self._finish(episode, "ended")
            if episode.sent_any:
                self._queue(episode, obs, {}, terminated=not truncated, truncated=bool(truncated))
            else:
                # The runner never saw this episode: nothing to train on, just free the slot.
                self._release_slot(episode.slot)

    # ------------------------------------------------------------------ runner side

    def take_ready(self, max_wait_s: float) -> tuple[dict[int, Step], dict[int, Exception]]:
        """Steps ready now (at most one per slot) and slots whose episode timed out.

        Waits up to `max_wait_s` for the first one, so the caller's loop stays
        responsive to stop requests and timeouts; may return nothing.
        """
        deadline = time.monotonic() + max_wait_s
        with self._lock:
            while True:
                ready = self._ready_slots()
                timed_out = self._timed_out_slots()
                if ready or timed_out or self._stopped:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._data_ready.wait(remaining)
            if ready and self.batch_wait_s > 0:
                batch_deadline = time.monotonic() + self.batch_wait_s
                while len(ready) < len(self._by_slot) - len(self._in_flight) and not self._stopped:
                    remaining = batch_deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._awaited = len(self._by_slot) - len(self._in_flight) - len(ready)
                    self._data_ready.wait(remaining)
                    self._awaited = None
                    ready = self._ready_slots()
            steps = {}
            for slot in ready:
                step = steps[slot] = self._by_slot[slot].steps.popleft()
                self._in_flight[slot] = step
            failures = {}
            for slot in timed_out:
                episode = self._by_slot[slot]
                self._finish(episode, f"timed out after {self.episode_timeout_s}s without a call")
                failures[slot] = ExternalEpisodeTimeout(
                    f"external episode {episode.episode_id!r} (sub-env {slot}): no client call "
                    f"for more than {self.episode_timeout_s}s (external_episode_timeout_s); "
                    "ended as faulty"
                )
            return steps, failures

    def training_enabled(self, slot: int) -> bool:
        """Whether the episode holding `slot` asked for its data to be trained on."""
        with self._lock:
            episode = self._by_slot.get(slot)
            return episode is None or episode.training_enabled

    def give_actions(self, slot: int, actions: MultiAgentDict) -> None:
        """The runner's actions for the step of `slot` it was handed last."""
        with self._lock:
            step = self._in_flight.pop(slot, None)
            if step is None or step.reply is None:
                return  # an off-policy step: the logged actions stand
            answer = {agent: actions[agent] for agent in step.obs if agent in actions}
            self._answer(self._by_slot.get(slot), step.reply, answer, None)

    def free_slot(self, slot: int) -> None:
        """The runner is done with the episode in `slot` (ended or faulty)."""
        with self._lock:
            self._in_flight.pop(slot, None)
            episode = self._by_slot.get(slot)
            if episode is not None and episode.ended and not episode.steps:
                self._release_slot(slot)

    def stop(self, reason: str) -> None:
        """Unblocks every waiting client call with `ExternalEnvStopped`; later calls raise it."""
        with self._lock:
            if self._stopped is not None:
                return
            self._stopped = reason
            for episode in self._by_slot.values():
                for step in list(episode.steps) + [self._in_flight.get(episode.slot)]:
                    if step is not None and step.reply is not None and not step.reply.done:
                        error = ExternalEnvStopped(f"get_action({episode.episode_id!r}): {reason}")
                        self._answer(episode, step.reply, None, error)
            self._data_ready.notify_all()
            self._slot_freed.notify_all()

    @property
    def num_running(self) -> int:
        """Episodes holding a slot (running, or ended and not yet consumed by the runner)."""
        with self._lock:
            return len(self._by_slot)

    # ------------------------------------------------------------------ helpers (lock held)

    def _answer(
        self,
        episode: _Episode | None,
        reply: _Reply,
        actions: MultiAgentDict | None,
        error: BaseException | None,
    ) -> None:
        """Hands a waiting call its answer; the episode is no longer waiting from now on."""
        reply.done = True
        if episode is not None:
            episode.waiting -= 1
            episode.last_call = time.monotonic()
        reply.deliver(actions, error)

    def _running(self, episode_id: Any, call: str) -> _Episode:
        self._raise_if_stopped(call)
        try:
            episode = self._episodes[episode_id]
        except (KeyError, TypeError):
            how = self._finished.get(episode_id) if _hashable(episode_id) else None
            if how is not None:
                raise ValueError(f"{call}: episode {episode_id!r} has already finished ({how})") from None
            raise ValueError(
                f"{call}: unknown episode {episode_id!r}; start it with start_episode() first"
            ) from None
        return episode

    def _queue(
        self,
        episode: _Episode,
        obs: MultiAgentDict,
        off_policy_actions: MultiAgentDict,
        *,
        terminated: bool = False,
        truncated: bool = False,
        reply: _Reply | None = None,
    ) -> None:
        """A new step carrying the rewards and infos logged since the last one."""
        infos = episode.infos
        step_infos = {agent: infos.pop(agent) for agent in obs if agent in infos}
        episode.steps.append(
            Step(
                obs=obs, rewards=episode.rewards, infos=step_infos,
                off_policy_actions=off_policy_actions, terminated=terminated,
                truncated=truncated, reply=reply,
            )
        )
        episode.rewards = {}
        episode.sent_any = True
        episode.last_call = time.monotonic()
        if self._awaited is not None:
            self._awaited -= 1
            if self._awaited > 0:
                return  # the runner waits for more steps to batch with this one
        self._data_ready.notify_all()

    def _finish(self, episode: _Episode, how: str) -> None:
        episode.ended = True
        self._episodes.pop(episode.episode_id, None)
        self._finished[episode.episode_id] = how
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _release_slot(self, slot: int) -> None:
        del self._by_slot[slot]
        # Most recently freed first: the data concentrates on few slots, so per-slot
        # fragments (rollout_fragment_length) fill up instead of all growing slowly.
        self._free_slots.appendleft(slot)
        self._slot_freed.notify()

    def _ready_slots(self) -> list[int]:
        return [
            slot for slot, episode in self._by_slot.items()
            if episode.steps and slot not in self._in_flight
        ]

    def _timed_out_slots(self) -> list[int]:
        if self.episode_timeout_s is None:
            return []
        quiet_since = time.monotonic() - self.episode_timeout_s
        return [
            slot for slot, episode in self._by_slot.items()
            if not episode.ended and not episode.steps and not episode.waiting
            and slot not in self._in_flight and episode.last_call < quiet_since
        ]

    def _raise_if_stopped(self, call: str) -> None:
        if self._stopped is not None:
            raise ExternalEnvStopped(f"{call}: {self._stopped}")


def _check_obs(
    obs: Any, episode_id: Any, call: str, *, allow_empty: bool = False
) -> MultiAgentDict:
    if not isinstance(obs, dict):
        raise ValueError(
            f"{call}({episode_id!r}): obs must be a dict agent_id -> observation, "
            f"got {type(obs).__name__}"
        )
    if not obs and not allow_empty:
        raise ValueError(f"{call}({episode_id!r}): obs is empty; expected at least one agent")
    return dict(obs)


def _reward(agent: AgentID, reward: Any, episode_id: Any) -> float:
    try:
        if isinstance(reward, (str, bytes, bool, np.bool_)):  # float() reads "5" and True
            raise TypeError
        value = float(reward)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"log_returns({episode_id!r}): reward of agent {agent!r} is {reward!r}; expected a number"
        ) from None
    _check_reward(agent, value, episode_id, "is")
    return value


def _check_reward(agent: AgentID, value: float, episode_id: Any, verb: str) -> None:
    if not math.isfinite(value) or abs(value) > LARGEST_REWARD:
        raise ValueError(
            f"log_returns({episode_id!r}): rewards of agent {agent!r} {verb} {value:g}; expected "
            f"finite values within +-{LARGEST_REWARD:.4g} (the float32 reward column)"
        )


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
