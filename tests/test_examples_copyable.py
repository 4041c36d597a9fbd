"""The copyable examples do what their docstrings promise, checked against the batches.

Each test runs an example's ``main`` in this process with small counts and
checks what it shows by a route the example does not take itself.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from examples import custom_connector, custom_env, custom_mapping, custom_metrics, train_ppo
from marl_runner import ConfigError, EnvRunner, RunnerConfig, restore_checkpoint
from marl_runner.checks import trajectory_rows
from marl_runner.metrics_log import read_progress_csv

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# --------------------------------------------------------------- custom connector from YAML


def test_time_feature_connector_from_yaml_changes_obs_and_space() -> None:
    result = custom_connector.main(["--steps", "60"])
    assert result["env_space"].shape == (18,)
    assert result["policy_space"].shape == (19,)  # the policy was built for the new space
    assert (result["policy_space"].low[-1], result["policy_space"].high[-1]) == (0.0, 1.0)
    rows, horizon = result["batch"], result["horizon"]
    assert rows["obs"].shape[1] == rows["new_obs"].shape[1] == 19
    np.testing.assert_allclose(rows["obs"][:, -1], np.minimum(rows["t"] / horizon, 1.0))
    # new_obs went through the connector too: one step further on
    np.testing.assert_allclose(rows["new_obs"][:, -1], np.minimum((rows["t"] + 1) / horizon, 1.0))


def test_time_feature_bad_horizon_names_the_config_key() -> None:
    data = RunnerConfig.from_yaml(custom_connector.CONFIG).to_dict()
    data["policies"]["shared"]["agent_connectors"][1]["horizon"] = 0
    with pytest.raises(ConfigError, match=r"agent_connectors\[1\]\.horizon.*int >= 1, got 0"):
        EnvRunner(RunnerConfig.from_dict(data))


# --------------------------------------------------------------- custom mapping function


def test_learner_seat_is_drawn_per_episode_and_both_agents_agree() -> None:
    with EnvRunner(RunnerConfig.from_yaml(custom_mapping.CONFIG)) as runner:
        batch = runner.sample(num_episodes=40)
    seats = {}
    for policy_id, rows in batch.policy_batches.items():
        for eps_id, agent_index in trajectory_rows(rows):
            seats.setdefault(eps_id, {})[policy_id] = agent_index
    assert len(seats) >= 40
    for by_policy in seats.values():  # one seat each, never the same one
        assert sorted(by_policy.values()) == [0, 1]
    learner_first = sum(by_policy["learner"] == 0 for by_policy in seats.values())
    assert 0 < learner_first < len(seats)  # the draw changes between episodes

    games = custom_mapping.main(["--episodes", "12"])
    assert {index for index, _ in games.values()} == {0, 1}
    assert all(reward in (-1.0, 0.0, 1.0) for _, reward in games.values())


def test_learner_vs_random_is_a_function_of_the_episode() -> None:
    for episode_id in range(20):
        episode = types.SimpleNamespace(episode_id=episode_id)
        picks = [custom_mapping.learner_vs_random(seat, episode) for seat in custom_mapping.SEATS]
        assert sorted(picks) == ["learner", "random"]
        again = [custom_mapping.learner_vs_random(seat, episode) for seat in custom_mapping.SEATS]
        assert again == picks
    with pytest.raises(ValueError, match="player_1.*'player_3'"):
        custom_mapping.learner_vs_random("player_3", types.SimpleNamespace(episode_id=0))


# --------------------------------------------------------------- custom MultiAgentEnv


def test_hive_rows_conserve_every_agents_reward_as_agents_spawn_and_die() -> None:
    table = custom_env.main(["--episodes", "4", "--max-steps", "40"])
    assert len(table) >= 4
    for agents in table.values():
        assert agents["queen"]["ended"] == "truncated" and agents["queen"]["t"] == (0, 39)
        for row in agents.values():
            assert row["reward_in_rows"] == pytest.approx(row["reward_from_env"])
            assert row["rows"] == row["t"][1] - row["t"][0] + 1
            assert row["ended"] in ("terminated", "truncated")
    workers = [row for agents in table.values() for a, row in agents.items() if a != "queen"]
    # agents spawned mid-episode and died before its end (the example is about them)
    assert len(workers) > len(table)
    assert any(row["ended"] == "terminated" and row["rows"] < 40 for row in workers)
    assert any(row["reward_from_env"] != 0 for row in workers)


def test_hive_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="max_workers=0"):
        custom_env.Hive(max_workers=0)


# --------------------------------------------------------------- callbacks with custom metrics


def test_kill_stats_custom_metrics_match_the_batch() -> None:
    result = custom_metrics.main(["--episodes", "4", "--max-cycles", "200"])
    metrics, batch = result["metrics"], result["batch"]
    custom = metrics["custom_metrics"]
    assert set(custom) == {"archer_kills", "knight_kills", "agents_lost"}

    kills: dict[str, dict[int, float]] = {"archer": {}, "knight": {}}
    last_t: dict[int, list[int]] = {}
    for policy_id, rows in batch.policy_batches.items():
        for (eps_id, _), index in trajectory_rows(rows).items():
            per_episode = kills[policy_id]
            per_episode[eps_id] = per_episode.get(eps_id, 0.0) + float(rows["rewards"][index].sum())
            last_t.setdefault(eps_id, []).append(int(rows["t"][index[-1]]))
    assert len(last_t) == metrics["episodes"] >= 4  # whole episodes: the batch is the metrics
    for policy_id in ("archer", "knight"):
        expected = sum(kills[policy_id].get(eps_id, 0.0) for eps_id in last_t) / len(last_t)
        assert custom[f"{policy_id}_kills"] == pytest.approx(expected)
    assert custom["archer_kills"] > 0  # these seeded episodes see kills and losses:
    assert custom["agents_lost"] > 0  # the checks have teeth
    # lost: agents whose last observation came before the episode's last round
    lost = [sum(t < max(ts) for t in ts) for ts in last_t.values()]
    assert custom["agents_lost"] == pytest.approx(np.mean(lost))


# --------------------------------------------------------------- PPO with a Ray runner group


def test_train_ppo_rejects_a_negative_runner_count(capsys) -> None:
    with pytest.raises(SystemExit):
        train_ppo.parse_args(["--runners", "-1"])
    assert "--runners -1: expected an int >= 0" in capsys.readouterr().err


@pytest.mark.slow  # starts two runner actors: about 10 s
@pytest.mark.timeout(180)
def test_train_ppo_with_runner_group_trains_the_remote_runners(
    ray_local, tmp_path, monkeypatch
) -> None:
    groups = []

    class RecordingGroup(train_ppo.EnvRunnerGroup):
        """Notes the remote runners' weights when built and just before being stopped."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.weights_at_start = self.foreach_runner(lambda r: r.get_weights(), local=False)
            groups.append(self)

        def stop(self) -> None:
            if not self._stopped:
                self.weights_at_end = self.foreach_runner(lambda r: r.get_weights(), local=False)
            super().stop()

    monkeypatch.setattr(train_ppo, "EnvRunnerGroup", RecordingGroup)
    run_dir = tmp_path / "run"
    summary = train_ppo.main(["--smoke", "--runners", "2", "--run-dir", str(run_dir)])

    (group,) = groups
    assert len(group.weights_at_start) == len(group.weights_at_end) == 2
    final = restore_checkpoint(run_dir / "checkpoints" / "final.ckpt")
    try:
        trained = final.get_weights()["shared"]
    finally:
        final.stop()
    for before, after in zip(group.weights_at_start, group.weights_at_end):
        changed = [
            not np.array_equal(before["shared"][k], after["shared"][k]) for k in before["shared"]
        ]
        assert any(changed)  # PPO updates reached every remote runner
        for key, value in after["shared"].items():  # ... and they hold the checkpointed weights
            np.testing.assert_array_equal(value, trained[key])

    rows = read_progress_csv(run_dir / "progress.csv")
    assert [row["iteration"] for row in rows] == [1.0, 2.0, 3.0]
    # one fragment per sub-env of each runner: 2 runners x 2 sub-envs x 30 agent steps / 3 agents
    assert [row["env_steps"] for row in rows] == [40.0, 80.0, 120.0]
    assert summary["env_steps"] == 120
    assert ray_local.is_initialized()  # the example did not shut down a Ray it did not start


def test_time_feature_horizon_is_read_from_the_built_chain(tmp_path) -> None:
    data = RunnerConfig.from_yaml(custom_connector.CONFIG).to_dict()
    chain = data["policies"]["shared"]["agent_connectors"]
    chain[1] = {"name": "examples.custom_connector:TimeFeature", "horizon": 10}
    path = tmp_path / "horizon_10.yaml"
    path.write_text(yaml.safe_dump(data))
    result = custom_connector.main(["--config", str(path), "--steps", "20"])
    assert result["horizon"] == 10
    rows = result["batch"]
    np.testing.assert_allclose(rows["obs"][:, -1], np.minimum(rows["t"] / 10, 1.0))

    chain[1] = "examples.custom_connector:TimeFeature"  # the plain-string form: horizon 25
    path.write_text(yaml.safe_dump(data))
    assert custom_connector.main(["--config", str(path), "--steps", "20"])["horizon"] == 25

    del chain[1]
    data["policies"]["shared"]["model"] = {"type": "mlp", "hidden": [8]}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit, match="no TimeFeature, got .*ObsPreprocessorConnector"):
        custom_connector.main(["--config", str(path)])


# --------------------------------------------------------------- train_ppo's flags and files


@pytest.mark.parametrize("flag", ["--update-epochs", "--num-minibatches"])
def test_train_ppo_rejects_ppo_counts_below_one(flag: str, capsys) -> None:
    with pytest.raises(SystemExit):
        train_ppo.parse_args([flag, "0"])
    assert f"{flag} 0: expected an int >= 1" in capsys.readouterr().err


def test_train_ppo_help_shows_each_default_once(capsys) -> None:
    with pytest.raises(SystemExit):
        train_ppo.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in help_text
    assert not re.search(r"default[^()]*\) \(default", help_text), help_text
    assert "runner config in examples/configs/ (without .yaml) (default: simple_spread)" in (
        help_text
    )
    assert "(default: the config's num_envs) --fragment-length" in help_text
    assert "(default: runs/<env>-<time>) --smoke" in help_text
    assert "--runners RUNNERS" in help_text and "(default: 0)" in help_text


def test_train_ppo_without_matplotlib_stops_before_training(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    with pytest.raises(SystemExit, match=r"matplotlib .*pip install -e '\.\[plot\]'"):
        train_ppo.main(["--smoke", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
def test_train_ppo_writes_the_summary_before_drawing(tmp_path, monkeypatch) -> None:
    def failing_plot(*args, **kwargs):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(train_ppo, "plot_learning_curve", failing_plot)
    with pytest.raises(RuntimeError, match="plot failed"):
        train_ppo.main(["--smoke", "--run-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] == read_progress_csv(tmp_path / "progress.csv")[-1]["env_steps"]


def test_the_progress_log_writes_any_columns_and_prints_the_steps_per_second(
    tmp_path, capsys
) -> None:
    """train_ppo's ProgressLog is the one the Connect Four examples write progress.csv with."""
    row = {"iteration": 1, "env_steps": 116, "sps": 699.4, "pool_win": 0.25}
    with contextlib.ExitStack() as stack:
        log = train_ppo.ProgressLog(tmp_path, list(row), stack)
        log.write(row, "vs pool")
        # flushed row by row: readable while the run goes on
        assert read_progress_csv(tmp_path / "progress.csv") == [row]
    assert log.file.closed and log.rows == [row]
    assert "iter    1  env_steps      116  SPS     699  vs pool" in capsys.readouterr().out


# --------------------------------------------------------------- every example reads as a tutorial

RUNNABLE = sorted(p for p in EXAMPLES.glob("*.py") if '__name__ == "__main__"' in p.read_text())


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda path: path.name)
def test_every_example_says_how_to_run_it_and_every_flag_has_help(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert f"python examples/{path.name}" in (ast.get_docstring(tree) or ""), path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            assert any(k.arg == "help" for k in node.keywords), f"{path.name}:{node.lineno}"
