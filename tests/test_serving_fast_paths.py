"""The request path's shortcuts give what the general path gives, and only where it applies.

Observations of agents sharing one Box are checked as one stacked array; the
runner's answers reach the event loop in bursts (`Handoff`). Each must hand
every caller exactly what the agent-by-agent checks and one hand-off per
answer did: the same converted values, the same refusals naming the agent
and the entry, every future its own answer.
"""

from __future__ import annotations

import asyncio
import threading

import gymnasium as gym
import numpy as np
import pytest

from marl_runner.serving.server import Handoff
from marl_runner.serving.validation import CallValues, RequestError, to_space

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


class _Spaces:
    """The part of an external env the checks read: each agent's spaces."""

    def __init__(self, spaces: dict) -> None:
        self.spaces = spaces

    def get_observation_space(self, agent):
        return self.spaces[agent]

    def get_action_space(self, agent):
        return gym.spaces.Discrete(2)


def _agent_by_agent(spaces: dict, obs: dict) -> dict:
    return {a: to_space(spaces[a], v, f"observation of agent {a!r}") for a, v in obs.items()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_one_box_gives_the_values_the_agent_by_agent_checks_give(dtype):
    spaces = dict.fromkeys(["a", "b", "c"], BOX)
    obs = {a: np.array([i - 1, 0.5 * (i - 1), 1 - i]).astype(dtype) for i, a in enumerate(spaces)}
    got = CallValues(_Spaces(spaces)).obs(obs)
    want = _agent_by_agent(spaces, obs)
    assert list(got) == list(want)
    for agent in want:
        assert got[agent].dtype == want[agent].dtype == np.float32
        np.testing.assert_array_equal(got[agent], want[agent])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.array([0, 0, np.nan], np.float32), r"observation of agent 'c' has a NaN at index 2"),
        (np.array([0, 2, 0], np.float32), r"observation of agent 'c' has 2\.0 at index 1, outside"),
        (np.array([0, 0, 0, 0], np.float32), r"observation of agent 'c': shape \(4,\)"),
        (np.array([0, 0, 0], np.float16), None),  # another dtype: checked agent by agent, fits
    ],
)
def test_a_refused_agent_is_named_as_the_agent_by_agent_checks_name_it(bad, message):
    spaces = dict.fromkeys(["a", "b", "c"], BOX)
    obs = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32), "c": bad}
    values = CallValues(_Spaces(spaces))
    if message is None:
        assert values.obs(obs)["c"].dtype == np.float32
        return
    with pytest.raises(RequestError, match=message):
        values.obs(obs)
    with pytest.raises(RequestError, match=message):
        _agent_by_agent(spaces, obs)


def test_unknown_agents_and_other_spaces_take_the_agent_by_agent_checks():
    values = CallValues(_Spaces({"a": BOX, "b": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)}))
    # Equal spaces that are two objects: each agent is converted by its own.
    out = values.obs({"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)})
    np.testing.assert_array_equal(out["b"], np.ones(3, np.float32))
    with pytest.raises(RequestError, match=r"obs: unknown agent 'z'"):
        values.obs({"a": np.zeros(3, np.float32), "z": np.zeros(3, np.float32)})
    assert values.obs({}, allow_empty=True) == {}


def test_handoff_settles_every_future_with_its_own_answer_in_few_wakeups():
    loop = asyncio.new_event_loop()
    wakeups = []
    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: (wakeups.append(1), original(*args))[1]
    handoff = Handoff(loop)

    async def main() -> list:
        futures = [loop.create_future() for _ in range(200)]
        futures[7].cancel()  # its request went away: the answer is dropped, nothing raises

        def runner() -> None:  # answers in bursts, as a forward pass does
            for i, future in enumerate(futures):
                error = ValueError(f"no {i}") if i % 10 == 3 else None
                handoff.settle(future, None if error else {"i": i}, error)

        thread = threading.Thread(target=runner)
        thread.start()
        results = await asyncio.gather(*futures, return_exceptions=True)
        thread.join()
        return results

    try:
        results = loop.run_until_complete(main())
    finally:
        loop.close()
    for i, result in enumerate(results):
        if i == 7:
            assert isinstance(result, asyncio.CancelledError)
        elif i % 10 == 3:
            assert isinstance(result, ValueError) and str(result) == f"no {i}"
        else:
            assert result == {"i": i}
    assert 1 <= len(wakeups) < len(results)
