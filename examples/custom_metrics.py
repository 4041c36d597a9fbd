"""Callbacks that add custom metrics to every episode of Knights-Archers-Zombies.

Shows: ``KillStats``, a ``marl_runner.Callbacks`` subclass. ``on_episode_step``
keeps the agents done so far (``episode.is_done``) in ``episode.user_data``;
``on_episode_end`` writes
``episode.custom_metrics``: zombies killed by archers and by knights (each
kill is a reward of 1 to the killer, summed from ``episode.agent_rewards``
by policy) and how many agents were lost before the episode's last round.
``runner.get_metrics()["custom_metrics"]`` reports their mean over the
episodes since the last call. The config
``examples/configs/kaz_custom_metrics.yaml`` names the class in
``callbacks:``, so ``marl-runner sample`` uses it too.

Run from the repository root:

    python examples/custom_metrics.py
    marl-runner sample examples/configs/kaz_custom_metrics.yaml --episodes 8

It prints each episode's custom metrics as the episode ends, then the means
from ``get_metrics()`` next to the per-policy rewards they must match.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from marl_runner import Callbacks, MultiAgentEpisode

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "kaz_custom_metrics.yaml"


class KillStats(Callbacks):
    """Per episode: ``archer_kills``, ``knight_kills`` and ``agents_lost``."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose

    def on_episode_start(self, *, episode: MultiAgentEpisode, **kwargs: Any) -> None:
        episode.user_data["done_agents"] = set()
        episode.user_data["lost"] = 0

    def on_episode_step(self, *, episode: MultiAgentEpisode, **kwargs: Any) -> None:
        # Agents done before the last round were killed (the last round ends them all).
        done = {agent for agent in episode.get_agents() if episode.is_done(agent)}
        episode.user_data["lost"] = len(episode.user_data["done_agents"])
        episode.user_data["done_agents"] = done

    def on_episode_end(self, *, episode: MultiAgentEpisode, **kwargs: Any) -> None:
        if episode.faulty:  # dropped episodes are not reported; nothing to count
            return
        kills = {"archer": 0.0, "knight": 0.0}
        for (_agent, policy_id), reward in episode.agent_rewards.items():
            if policy_id in kills:
                kills[policy_id] += reward
        episode.custom_metrics["archer_kills"] = kills["archer"]
        episode.custom_metrics["knight_kills"] = kills["knight"]
        episode.custom_metrics["agents_lost"] = float(episode.user_data["lost"])
        if self.verbose:
            print(
                f"episode {episode.episode_id:>20} ended after {episode.length:3d} steps: "
                + ", ".join(f"{k} {v:g}" for k, v in episode.custom_metrics.items())
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Samples whole episodes with ``KillStats``; returns ``get_metrics()`` and the batch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes",
        type=int,
        default=8,
        help="at least this many whole episodes: the sub-envs step together and every "
        "episode that ends in the last round counts, so often a few more",
    )
    parser.add_argument("--max-cycles", type=int, default=300, help="KAZ's episode time limit")
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:  # the config names "examples.custom_metrics:KillStats"
        sys.path.insert(0, str(REPO))
    from marl_runner import EnvRunner, RunnerConfig

    config = RunnerConfig.from_yaml(CONFIG).with_overrides(
        [f"env.config.max_cycles={args.max_cycles}"]
    )
    # A Callbacks instance passed in wins over the config's `callbacks:` import path.
    with EnvRunner(config, callbacks=KillStats(verbose=True)) as runner:
        batch = runner.sample(num_episodes=args.episodes)
        metrics = runner.get_metrics()
    custom = metrics["custom_metrics"]
    print(f"get_metrics() over {metrics['episodes']} episodes:")
    for name, value in sorted(custom.items()):
        print(f"  custom_metrics[{name!r}] = {value:.3f}")
    for policy_id in ("archer", "knight"):
        print(
            f"  policy_reward_mean[{policy_id!r}] = "
            f"{metrics['policy_reward_mean'].get(policy_id, 0.0):.3f}  (= {policy_id}_kills)"
        )
    return {"metrics": metrics, "batch": batch}


if __name__ == "__main__":
    main()
