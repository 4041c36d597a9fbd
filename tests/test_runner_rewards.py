"""Where rewards land: on the transition the ledger names, and all of them in the metrics.

``RewardPlacementLog`` records, round by round, what the env gave and who
observed; ``expected_rows`` replays the reward rules on that log, so any env
(scripted or real PettingZoo) checks the exact reward of every row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from marl_runner import Callbacks, EnvRunner
from marl_runner.bench.envs.scripted_env import Round, ScriptedEnv
from marl_runner.checks import trajectory_rows
from marl_runner.envs import MultiAgentEnv, ParallelPettingZooEnv, make_env, register_env
from tests.envs import PadSpacesWrapper
from tests.runner_helpers import EpisodeTracker, config

TESTING = "tests.envs:"


class RewardPlacementLog(MultiAgentEnv):
    """Wraps a MultiAgentEnv; ``episodes[k]`` lists episode k's rounds as
    ``(obs agents, rewards, own done agents, episode over)``."""

    def __init__(self, env: MultiAgentEnv) -> None:
        self.env = env
        self.possible_agents = env.possible_agents
        self.observation_spaces = env.observation_spaces
        self.action_spaces = env.action_spaces
        self.episodes: list[list[tuple[set, dict, set, bool]]] = []

    def get_observation_space(self, agent: Any) -> Any:
        return self.env.get_observation_space(agent)

    def get_action_space(self, agent: Any) -> Any:
        return self.env.get_action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        obs, infos = self.env.reset(seed=seed, options=options)
        self.episodes.append([(set(obs), {}, set(), False)])
        return obs, infos

    def step(self, actions: dict) -> tuple:
        obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
        done = {a for flags in (terminateds, truncateds) for a, flag in flags.items() if flag} - {"__all__"}
        over = bool(terminateds.get("__all__") or truncateds.get("__all__"))
        self.episodes[-1].append((set(obs), {a: float(r) for a, r in rewards.items()}, done, over))
        return obs, rewards, terminateds, truncateds, infos


def expected_rows(rounds: list[tuple[set, dict, set, bool]]) -> dict[Any, list[float]]:
    """The rules' placement, replayed: the reward of each transition of each agent."""
    agents = set().union(*(obs | set(rewards) for obs, rewards, _, _ in rounds))
    rows: dict[Any, list[float]] = {}
    for agent in agents:
        held, after_done, seen, done, out = 0.0, 0.0, False, False, []
        for obs, rewards, done_now, over in rounds:
            reward = rewards.get(agent, 0.0)
            ends = agent in done_now or over
            if done:
                after_done += reward
            elif agent in obs:
                if not seen and ends:
                    break  # first seen already done: no transition at all
                if seen:
                    out.append(held + reward)
                    held = 0.0
                else:
                    held += reward
                seen, done = True, ends
            else:
                held += reward
                if seen and ends:  # fake final obs
                    out.append(held)
                    held, done = 0.0, True
        if out:
            out[-1] += after_done
            rows[agent] = out
    return rows


def placement_env_name(name: str) -> str:
    logged = "placement_" + name.replace(":", "__").replace(".", "_")
    register_env(logged, lambda cfg, n=name: RewardPlacementLog(make_env({"name": n, "config": cfg})))
    return logged


def _generated_parallel_env(cfg: dict) -> MultiAgentEnv:
    """Agents of several types spawn and die; padded to one space so one policy serves all."""
    from pettingzoo.test.example_envs import generated_agents_parallel_v0

    return PadSpacesWrapper(ParallelPettingZooEnv(generated_agents_parallel_v0.parallel_env()))


register_env("generated_parallel_padded", _generated_parallel_env)


def sample_episodes(env: str, num_episodes: int, **overrides: Any):
    tracker = EpisodeTracker()
    cfg = config(placement_env_name(env), batch_mode="complete_episodes", **overrides)
    runner = EnvRunner(cfg, callbacks=tracker)
    with runner:
        batch = runner.sample(num_episodes=num_episodes)
        metrics = runner.get_metrics()
        logs = [env.episodes for env in runner.env.get_sub_environments()]
    return batch, metrics, tracker, logs


def check_placement(batch: Any, tracker: EpisodeTracker, logs: list) -> int:
    """Every row of every finished episode carries exactly the reward the rules give it; returns #trajectories."""
    checked = 0
    for env_index, episode_ids in tracker.started.items():
        for position, eps_id in enumerate(episode_ids):
            if eps_id not in tracker.agents:
                continue
            expected = expected_rows(logs[env_index][position])
            agents = tracker.agents[eps_id]
            got = {}
            for policy_batch in batch.policy_batches.values():
                for (eps, index), rows in trajectory_rows(policy_batch).items():
                    if eps == eps_id:
                        got[agents[index]] = policy_batch["rewards"][rows]
            assert set(got) == set(expected), (eps_id, sorted(got), sorted(expected))
            for agent, rewards in got.items():
                np.testing.assert_allclose(rewards, expected[agent], atol=1e-5, err_msg=str(agent))
                checked += 1
    return checked


def test_rewards_before_the_first_obs_and_after_done_sit_on_the_named_rows() -> None:
    batch, metrics, tracker, logs = sample_episodes(
        TESTING + "RewardedBeforeAndAfterEnv", 1, num_envs=1
    )
    eps_id = tracker.ended[0]
    shared = batch.policy_batches["shared"]
    by_agent = {
        tracker.agents[eps][index]: shared["rewards"][rows]
        for (eps, index), rows in trajectory_rows(shared).items()
        if eps == eps_id
    }
    np.testing.assert_allclose(by_agent["b"], [3.0, 7.5])
    np.testing.assert_allclose(by_agent["a"], [1.0] * 6)
    assert check_placement(batch, tracker, logs) == 2
    # Metrics count every reward the env gave, the ones after b was done included.
    assert metrics["episode_reward_mean"] == pytest.approx(6.0 + 10.5)
    assert metrics["policy_reward_mean"]["shared"] == pytest.approx(6.0 + 10.5)


def test_a_reward_after_the_final_row_was_handed_out_is_counted_late() -> None:
    # Fragments of 3 env steps: b's final transition (round 4) is handed out before
    # rounds 5 and 6 reward it again.
    tracker = EpisodeTracker()
    cfg = config(TESTING + "RewardedBeforeAndAfterEnv", num_envs=1, rollout_fragment_length=4)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_env_steps=8)
        metrics = runner.get_metrics()
    shared = batch.policy_batches["shared"]
    eps_id = tracker.ended[0]
    b_rows = [shared["rewards"][rows] for (eps, index), rows in trajectory_rows(shared).items()
              if eps == eps_id and tracker.agents[eps][index] == "b"]
    np.testing.assert_allclose(b_rows[0], [3.0, 2.0])
    assert metrics["num_late_rewards"] == 2
    assert metrics["episode_reward_mean"] == pytest.approx(16.5)


@pytest.mark.parametrize(
    "env, num_episodes",
    [
        (TESTING + "DyingAgentsEnv", 2),
        (TESTING + "SpawningAgentsEnv", 2),
        (TESTING + "TurnBasedEnv", 2),
        ("pettingzoo.classic.tictactoe_v3:env", 8),
    ],
)
def test_every_row_carries_the_reward_spec_names(env: str, num_episodes: int) -> None:
    batch, _, tracker, logs = sample_episodes(env, num_episodes, num_envs=2)
    assert check_placement(batch, tracker, logs) >= num_episodes


class EndOfEpisodeMetrics(Callbacks):
    """Sets custom metrics where RLlib users set them: in on_episode_end."""

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        episode.custom_metrics["length_at_end"] = episode.length
        episode.custom_metrics["total_at_end"] = episode.total_reward


def test_custom_metrics_set_in_on_episode_end_are_reported() -> None:
    cfg = config(TESTING + "RewardedBeforeAndAfterEnv", num_envs=1, batch_mode="complete_episodes")
    with EnvRunner(cfg, callbacks=EndOfEpisodeMetrics()) as runner:
        runner.sample(num_episodes=2)
        metrics = runner.get_metrics()
    assert metrics["custom_metrics"] == {"length_at_end": 6.0, "total_at_end": pytest.approx(16.5)}


class EpisodeKeeper(Callbacks):
    """Keeps every episode object, to name agents of episodes still running."""

    def __init__(self) -> None:
        self.episodes: dict[int, Any] = {}
        self.order: dict[int, list[int]] = {}

    def on_episode_created(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        self.episodes[episode.episode_id] = episode
        self.order.setdefault(env_index, []).append(episode.episode_id)


def test_agents_spawning_with_a_reward_keep_it_on_their_first_transition() -> None:
    # The generated env's episodes run for a long time: check every trajectory that
    # finished within the sampled fragments, against the log of its running episode.
    keeper = EpisodeKeeper()
    cfg = config(placement_env_name("generated_parallel_padded"), num_envs=2,
                 rollout_fragment_length=100)
    with EnvRunner(cfg, callbacks=keeper) as runner:
        batch = runner.sample(num_env_steps=600)
        logs = [env.episodes for env in runner.env.get_sub_environments()]
    shared = batch.policy_batches["shared"]
    done = shared["terminateds"] | shared["truncateds"]
    checked = 0
    for (eps_id, index), rows in trajectory_rows(shared).items():
        if shared["t"][rows[0]] != 0 or not done[rows[-1]]:
            continue
        episode = keeper.episodes[eps_id]
        env_index = episode.env_id
        log = logs[env_index][keeper.order[env_index].index(eps_id)]
        agent = next(a for a in episode.get_agents() if episode.agent_index(a) == index)
        np.testing.assert_allclose(shared["rewards"][rows], expected_rows(log)[agent], atol=1e-5)
        checked += 1
    assert checked >= 20


def _early_death_env(cfg: dict) -> ScriptedEnv:
    """a0 is rewarded on unchanged rounds (the fast path), then dies at round 4; a1 plays on."""
    agents = ("a0", "a1")
    script = [Round(agents)]
    for index in range(1, 11):
        observing = agents if index <= 4 else ("a1",)
        script.append(Round(
            observing, {a: 0.25 * (index + observing.index(a)) for a in observing},
            terminated=("a0",) if index == 4 else (), end="terminated" if index == 10 else None,
        ))
    return ScriptedEnv(script, agents)


register_env("early_death", _early_death_env)


class AgentRewardsAtEnd(Callbacks):
    """Each ended episode's per-agent totals, as the metrics record reads them."""

    def __init__(self) -> None:
        self.totals: dict[int, list[dict]] = {}

    def on_episode_end(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        totals = {agent: total for (agent, _), total in episode.agent_rewards.items()}
        self.totals.setdefault(env_index, []).append(totals)


@pytest.mark.parametrize(
    ("env", "env_config"),
    [
        ("early_death", {}),
        (TESTING + "DyingAgentsEnv", {}),
        (TESTING + "TurnBasedEnv", {}),
        (TESTING + "CheapEnv", {"num_agents": 3, "episode_len": 7}),
    ],
)
def test_episode_totals_count_every_reward_also_of_agents_whose_rows_were_handed_out(
    env: str, env_config: dict
) -> None:
    # Fragments of 2 steps: dead agents' trajectories are built and released mid-episode.
    recorder = AgentRewardsAtEnd()
    cfg = config(placement_env_name(env), num_envs=2, rollout_fragment_length=2, env_config=env_config)
    with EnvRunner(cfg, callbacks=recorder) as runner:
        runner.sample(num_env_steps=60)
        logs = [sub_env.episodes for sub_env in runner.env.get_sub_environments()]
    ended = 0
    for env_index, episodes in recorder.totals.items():
        for position, totals in enumerate(episodes):
            given: dict = {}
            for _, rewards, _, _ in logs[env_index][position]:
                for agent, reward in rewards.items():
                    given[agent] = given.get(agent, 0.0) + reward
            assert totals.keys() >= given.keys()
            for agent, total in totals.items():
                assert total == pytest.approx(given.get(agent, 0.0), abs=1e-5), (env, position, agent)
            ended += 1
    assert ended >= 2
