"""examples/train_mappo.py: runs end to end (--smoke) through train_ppo's loop, and its GAE reads
the central critic."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from examples import train_mappo, train_ppo
from marl_runner import EnvRunner, SampleBatch, TorchPolicy
from marl_runner.metrics_log import read_progress_csv
from marl_runner.policy.gae import compute_gae

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a short training run: test-all (make test stays under 3 minutes)
@pytest.mark.timeout(120)
def test_train_mappo_smoke_writes_progress_summary_and_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "examples/train_mappo.py", "--smoke", "--value-norm", "--run-dir", str(run_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SPS" in result.stdout
    rows = read_progress_csv(run_dir / "progress.csv")
    assert [row["iteration"] for row in rows] == [1.0, 2.0, 3.0]
    for row in rows:
        for key in ("shared/policy_loss", "shared/value_loss", "shared/entropy"):
            assert math.isfinite(row[key]), (key, row)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == "mappo" and summary["env_steps"] == rows[-1]["env_steps"]
    # Where the time went: sampling and learning apart, each within the training wall time.
    assert summary["sample_s"] == pytest.approx(sum(row["sample_s"] for row in rows), abs=0.2)
    assert summary["learn_s"] == pytest.approx(sum(row["train_s"] for row in rows), abs=0.2)
    assert summary["sample_s"] + summary["learn_s"] <= summary["train_wall_s"] + 0.1
    assert summary["sample_sps"] > 0 and summary["learn_sps"] > 0
    assert math.isfinite(summary["trained_episode_reward_mean"])
    assert (run_dir / "checkpoints" / "final.ckpt").exists()


def test_the_config_captures_the_state_and_drops_the_runners_gae() -> None:
    args = train_mappo.parse_args(["--smoke"])
    config = train_mappo.make_mappo_config(args)
    assert config.env["capture_state"] is True
    assert "gae" not in config.policies["shared"]["config"]


def test_central_gae_bootstraps_from_new_env_state_unless_terminated() -> None:
    """Two trajectories of two rows: agent 0 truncated (bootstrapped from the critic's value
    of its last new_env_state), agent 1 terminated (worth 0 after its last row)."""
    rng = np.random.default_rng(0)
    actor = TorchPolicy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), {"seed": 0})
    torch.manual_seed(0)
    learner = train_mappo.CentralCriticLearner(actor, state_dim=4, num_agents=2)
    batch = SampleBatch(
        {
            "eps_id": np.array([7, 7, 7, 7]),
            "agent_index": np.array([0, 0, 1, 1]),
            "t": np.array([0, 1, 0, 1]),
            "rewards": np.array([1.0, 2.0, 3.0, 4.0], np.float32),
            "terminateds": np.array([False, False, False, True]),
            "env_state": rng.normal(size=(4, 4)).astype(np.float32),
            "new_env_state": rng.normal(size=(4, 4)).astype(np.float32),
        }
    )
    args = Namespace(gamma=0.9, gae_lambda=0.8)
    train_mappo.central_gae(learner, batch, args)
    with torch.no_grad():
        values = learner.values(batch).numpy()
        next_values = learner.values(batch, "new_env_state").numpy()
    expected_truncated = compute_gae(batch["rewards"][:2], values[:2], next_values[1], 0.9, 0.8)
    expected_terminated = compute_gae(batch["rewards"][2:], values[2:], 0.0, 0.9, 0.8)
    np.testing.assert_allclose(batch["advantages"][:2], expected_truncated[0], rtol=1e-5)
    np.testing.assert_allclose(batch["advantages"][2:], expected_terminated[0], rtol=1e-5)
    np.testing.assert_allclose(batch["value_targets"] - batch["advantages"], values, rtol=1e-5)


def test_trajectory_rows_cut_at_agent_episode_and_time_gaps_in_any_row_order() -> None:
    batch = SampleBatch(
        {
            "eps_id": np.array([1, 1, 1, 1, 2, 2]),
            "agent_index": np.array([0, 0, 1, 1, 0, 0]),
            "t": np.array([3, 4, 0, 1, 0, 2]),
        }
    )
    expected = [[0, 1], [2, 3], [4], [5]]
    assert [rows.tolist() for rows in train_mappo.trajectory_rows(batch)] == expected
    # Step-major order, as the runner stores rows: the same trajectories, each in time order.
    step_major = [2, 4, 0, 3, 1, 5]
    shuffled = SampleBatch({k: v[step_major] for k, v in batch.items()})
    runs = [np.asarray(step_major)[rows].tolist() for rows in train_mappo.trajectory_rows(shuffled)]
    assert runs == expected


@pytest.mark.timeout(60)
def test_central_gae_follows_each_agent_through_a_real_interleaved_batch() -> None:
    """A runner batch of simple_spread (rows of the three agents interleaved step by step):
    each agent's advantages are GAE over its own rows in time order."""
    args = train_mappo.parse_args(["--smoke"])
    with EnvRunner(train_mappo.make_mappo_config(args)) as runner:
        batch = runner.sample().policy_batches["shared"]
    assert len(np.unique(batch["agent_index"][:3])) > 1  # interleaved, not grouped
    actor = TorchPolicy(*runner.get_spaces()["shared"], {"seed": 0})
    learner = train_mappo.CentralCriticLearner(actor, batch["env_state"].shape[1], 3)
    train_mappo.central_gae(learner, batch, Namespace(gamma=0.99, gae_lambda=0.95))
    with torch.no_grad():
        values, next_values = (
            learner.values(batch).numpy(),
            learner.values(batch, "new_env_state").numpy(),
        )
    for eps_id, agent in {(e, a) for e, a in zip(batch["eps_id"], batch["agent_index"])}:
        rows = np.flatnonzero((batch["eps_id"] == eps_id) & (batch["agent_index"] == agent))
        rows = rows[np.argsort(batch["t"][rows])]
        assert (np.diff(batch["t"][rows]) == 1).all()
        last = 0.0 if batch["terminateds"][rows[-1]] else next_values[rows[-1]]
        expected, _ = compute_gae(batch["rewards"][rows], values[rows], last, 0.99, 0.95)
        np.testing.assert_allclose(batch["advantages"][rows], expected, rtol=1e-4, atol=1e-5)


def test_value_norm_standardises_targets_and_gae_runs_on_returns() -> None:
    """With a ValueNorm the critic's outputs are standardised values: GAE maps them back,
    and the stored targets are the returns standardised by the updated statistics."""
    rng = np.random.default_rng(1)
    norm = train_mappo.ValueNorm()
    assert norm.stats() == (0.0, 1.0)
    returns = rng.normal(-40.0, 8.0, 1000)
    norm.update(returns)
    mean, std = norm.stats()
    assert mean == pytest.approx(returns.mean()) and std == pytest.approx(returns.std(), rel=1e-4)
    np.testing.assert_allclose(norm.denormalize(norm.normalize(returns)), returns, rtol=1e-5)

    actor = TorchPolicy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), {"seed": 0})
    torch.manual_seed(0)
    learner = train_mappo.CentralCriticLearner(actor, 4, 1, train_mappo.ValueNorm())
    learner.value_norm.update(returns)
    batch = SampleBatch(
        {
            "eps_id": np.zeros(3, np.int64), "agent_index": np.zeros(3, np.int64),
            "t": np.arange(3), "rewards": np.array([-2.0, -1.0, -3.0], np.float32),
            "terminateds": np.array([False, False, True]),
            "env_state": rng.normal(size=(3, 4)).astype(np.float32),
            "new_env_state": rng.normal(size=(3, 4)).astype(np.float32),
        }
    )  # fmt: skip
    with torch.no_grad():
        raw = learner.values(batch).numpy()
    values = norm.denormalize(raw)  # same statistics as the learner's before the batch
    advantages, targets = compute_gae(batch["rewards"], values, 0.0, 0.9, 0.8)
    train_mappo.central_gae(learner, batch, Namespace(gamma=0.9, gae_lambda=0.8))
    np.testing.assert_allclose(batch["advantages"], advantages, rtol=1e-4)
    np.testing.assert_allclose(
        batch["value_targets"], learner.value_norm.normalize(targets), rtol=1e-4
    )
    assert learner.value_norm.stats() != (mean, std)  # the batch's targets were folded in


def _fake_run(run_dir: Path, rewards: list[float], random: float) -> Path:
    run_dir.mkdir(parents=True)
    lines = ["iteration,env_steps,episode_reward_mean"]
    lines += [f"{i + 1},{800 * (i + 1)},{r}" for i, r in enumerate(rewards)]
    (run_dir / "progress.csv").write_text("\n".join(lines) + "\n")
    summary = {
        "random_episode_reward_mean": random, "trained_episode_reward_mean": rewards[-1],
        "env_steps": 800 * len(rewards), "train_wall_s": 1.0, "sps": 800.0,
    }  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_compare_runs_draws_the_groups_and_lists_their_summaries(tmp_path: Path) -> None:
    from examples import compare_runs

    ippo = _fake_run(tmp_path / "ippo", [-80.0, float("nan"), -60.0], random=-90.0)
    mappo = _fake_run(tmp_path / "mappo", [-70.0, -50.0, -40.0], random=-88.0)
    out = tmp_path / "img" / "curves.png"
    table = compare_runs.main([f"IPPO={ippo}", f"MAPPO={mappo}", "--out", str(out)])
    assert out.read_bytes().startswith(b"\x89PNG")
    assert [(row["label"], row["trained_episode_reward_mean"]) for row in table] == [
        ("IPPO", -60.0),
        ("MAPPO", -40.0),
    ]
    np.testing.assert_array_equal(
        compare_runs.smoothed(np.array([1.0, np.nan, 3.0, 5.0]), 2), [1.0, np.nan, 2.0, 4.0]
    )
    with pytest.raises(SystemExit):
        compare_runs.main([f"IPPO={tmp_path / 'missing'}", "--out", str(out)])


def test_compare_runs_draws_a_run_still_training_and_reference_lines(
    tmp_path: Path, capsys
) -> None:
    from examples import compare_runs

    ended = _fake_run(tmp_path / "ended", [-80.0, -60.0], random=-90.0)
    running = _fake_run(tmp_path / "running", [-75.0, -55.0, -45.0], random=-90.0)
    (running / "summary.json").unlink()  # a run still training has no summary yet
    out = tmp_path / "curves.png"
    argv = [f"MAPPO={ended},{running}", "--out", str(out), "--hline", "scripted, greedy=-24.8"]
    table = compare_runs.main(argv)
    assert out.read_bytes().startswith(b"\x89PNG")
    assert [row["run"] for row in table] == ["ended"]  # only ended runs have a summary row
    assert compare_runs.parse_hlines(["a=b=-1.5"], None) == {"a=b": -1.5}
    with pytest.raises(SystemExit):
        compare_runs.main([f"MAPPO={ended}", "--out", str(out), "--hline", "scripted"])
    assert "--hline 'scripted': expected LABEL=NUMBER" in capsys.readouterr().err


def test_train_mappo_help_describes_mappo_and_its_run_dir(capsys) -> None:
    with pytest.raises(SystemExit):
        train_mappo.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "MAPPO on marl-runner batches" in help_text
    assert "Independent PPO" not in help_text
    assert "(default: runs/<env>-mappo-<time>) --smoke" in help_text


@pytest.mark.timeout(60)
def test_train_runs_the_loop_with_the_algorithm_it_is_given(tmp_path: Path) -> None:
    """train_ppo.train builds the learners once, from the first batch, and calls the given
    update for each policy on every iteration: MAPPO passes its own and has no loop."""
    args = train_ppo.parse_args(["--smoke"])
    first_batches, updates = [], []

    def make_learners(runner, args, first_batch):
        first_batches.append(first_batch)
        return train_ppo.make_learners(runner, args)

    def update(learner, optimizer, batch, args, rng):
        updates.append((len(batch), optimizer.param_groups[0]["lr"]))
        return train_ppo.ppo_update(learner, optimizer, batch, args, rng)

    probe = train_ppo.Algorithm("probe", make_learners, update)
    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(EnvRunner(train_ppo.make_config(args)))
        log = train_ppo.ProgressLog(tmp_path, train_ppo.progress_fields(["shared"]), stack)
        counts = train_ppo.train(runner, None, args, log, tmp_path, probe)
    assert len(first_batches) == 1 and "shared" in first_batches[0].policy_batches
    assert len(updates) == counts["iterations"] == 3
    lrs = [lr for _, lr in updates]
    assert lrs[0] == args.lr and lrs[0] > lrs[1] > lrs[2] > 0  # annealed per iteration
    rows = read_progress_csv(tmp_path / "progress.csv")
    assert [row["shared/policy_loss"] for row in rows] == pytest.approx(
        [row["shared/policy_loss"] for row in log.rows]
    )
