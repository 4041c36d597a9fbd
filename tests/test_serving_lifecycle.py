"""`marl-runner serve` stopping: every finished episode is written, counted once, with unique ids.

Each test runs the real command in a subprocess against the drone config
(default `batch_mode: truncate_episodes`, fragments of 200 env steps, which
used to hold finished episodes back) and stops it by a signal or a target.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers_serve_process import ServeProcess, serve_process

from marl_runner.checks import check_batch_invariants
from marl_runner.client import PolicyClient
from marl_runner.io import read_batches

DRONES = [f"drone_{i}" for i in range(4)]


@contextmanager
def serve(out: Path, *extra: str) -> Iterator[ServeProcess]:
    with serve_process(
        "--port", "0", "--out", str(out), "--set", "num_envs=4", "--progress-interval", "0.2",
        *extra,
    ) as server:
        yield server


def play(client: PolicyClient, episodes: int, steps: int, seed: int) -> int:
    """Plays whole episodes; returns how many ended."""
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        eid = client.start_episode()
        for _ in range(steps):
            client.get_action(eid, {d: rng.uniform(-1, 1, 8).astype(np.float32) for d in DRONES})
            client.log_returns(eid, {d: 1.0 for d in DRONES})
        client.end_episode(eid, {d: np.zeros(8, np.float32) for d in DRONES})
    return episodes


def written(out: Path) -> tuple[int, int]:
    """(env steps, episodes) in --out; each (episode, agent) has t = 0..n-1 exactly once."""
    env_steps, eps_ids = 0, set()
    for batch in read_batches(out):
        check_batch_invariants(batch)
        env_steps += batch.env_steps()
        for policy_batch in batch.policy_batches.values():
            eps_ids.update(policy_batch["eps_id"].tolist())
    t_by_trajectory: dict[tuple, list[int]] = {}
    for batch in read_batches(out):
        for policy_batch in batch.policy_batches.values():
            for eps, agent, t in zip(
                policy_batch["eps_id"].tolist(), policy_batch["agent_index"].tolist(),
                policy_batch["t"].tolist(), strict=True,
            ):
                t_by_trajectory.setdefault((eps, agent), []).append(t)
    for key, ts in t_by_trajectory.items():
        assert sorted(ts) == list(range(len(ts))), f"trajectory {key}: t = {sorted(ts)}"
    return env_steps, len(eps_ids)


def table(output: str) -> tuple[int, int]:
    """(env steps, episodes) of the final table."""
    table_steps = re.search(r"env steps\s*│\s*([\d,]+)", output)
    table_episodes = re.search(r"│ episodes\s*│\s*([\d,]+)", output)
    assert table_steps and table_episodes, output
    return number(table_steps.group(1)), number(table_episodes.group(1))


def last_progress(output: str) -> tuple[int, int]:
    """(env steps, episodes) of the last progress line (serving without a target)."""
    lines = re.findall(r"serving: ([\d,]+) env steps, ([\d,]+) episodes", output)
    assert lines, output
    return number(lines[-1][0]), number(lines[-1][1])


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_right_after_the_last_episode_writes_every_episode(tmp_path, sig):
    out = tmp_path / "out"
    with serve(out) as server:
        with PolicyClient(server.address) as client:
            play(client, 10, 50, seed=0)
        output = server.finish(sig)  # at once: the last end_episode may still be queued
    assert written(out) == (500, 10)
    assert last_progress(output) == table(output) == (500, 10), output
    assert "wrote 10 batches (10 episodes, 500 env steps)" in output


def test_episodes_target_counts_finished_episodes_and_writes_them(tmp_path):
    out = tmp_path / "out"
    with serve(out, "--episodes", "10") as server:
        with PolicyClient(server.address) as client:
            play(client, 10, 50, seed=1)
        output = server.finish(None)  # the target stops it
    assert written(out) == (500, 10)
    assert table(output) == (500, 10), output
    assert re.findall(r"sampling: .*", output)[-1].startswith("sampling: 10/10 episodes"), output


def test_local_and_remote_clients_episodes_are_all_written_with_unique_ids(tmp_path):
    out = tmp_path / "out"
    with serve(out) as server:
        ended: list[int] = []
        errors: list[BaseException] = []

        def client_thread(mode: str, seed: int) -> None:
            try:
                with PolicyClient(server.address, inference_mode=mode) as client:
                    ended.append(play(client, 4, 20, seed))
                    if mode == "remote":  # an episode left open: abandoned, never written
                        eid = client.start_episode()
                        client.get_action(eid, {d: np.zeros(8, np.float32) for d in DRONES})
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=client_thread, args=(mode, seed), daemon=True)
            for seed, mode in enumerate(["remote", "local", "local", "local"])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors and not any(t.is_alive() for t in threads), errors
        output = server.finish(signal.SIGINT)
    assert sum(ended) == 16
    # Three local runners built from one config (seed 0): their episode ids still differ.
    assert written(out) == (16 * 20, 16)
    assert last_progress(output) == table(output) == (320, 16), output
    assert "12 batches came from local-inference clients" in output
