"""`marl-runner serve`: batches to --out, clients served, clean exit on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from marl_runner.checks import check_batch_invariants, rewards_per_trajectory
from marl_runner.cli import main
from marl_runner.client import PolicyClient
from marl_runner.io import read_batches

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "serve_drones.yaml"
DRONES = [f"drone_{i}" for i in range(4)]


def play(client: PolicyClient, steps: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    eid = client.start_episode()
    logged: dict[str, float] = {}
    for _ in range(steps):
        obs = {d: rng.uniform(-1, 1, 8).astype(np.float32) for d in DRONES}
        actions = client.get_action(eid, obs)
        assert set(actions) == set(DRONES) and all(0 <= a < 5 for a in actions.values())
        rewards = {d: float(rng.integers(-3, 4)) for d in DRONES}
        client.log_returns(eid, rewards)
        for d, r in rewards.items():
            logged[d] = logged.get(d, 0.0) + r
    client.end_episode(eid, {d: np.zeros(8, np.float32) for d in DRONES})
    return logged


def test_serve_writes_batches_and_exits_cleanly_on_sigterm(tmp_path):
    out = tmp_path / "out"
    server = subprocess.Popen(
        [sys.executable, "-m", "marl_runner.cli", "serve", str(CONFIG), "--port", "0",
         "--out", str(out), "--set", "num_envs=4",
         "--progress-interval", "0.2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines: list[str] = []
    try:
        address = None
        for line in server.stdout:
            lines.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if found:
                address = found.group(1)
                break
        assert address, "".join(lines)
        totals: list[dict[str, float]] = []
        with PolicyClient(address) as client:
            threads = [
                threading.Thread(target=lambda s=s: totals.append(play(client, 5, s)))
                for s in range(3)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        server.send_signal(signal.SIGTERM)
        rest, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    output = "".join(lines) + rest
    assert server.returncode == 0, output
    assert "serving metrics" in output and "sampling metrics" not in output
    assert "wrote 3 batches" in output
    assert re.search(r"serving: \d+ env steps, \d+ episodes", output)
    batches = list(read_batches(out))
    assert len(batches) == 3 and (out / "config.yaml").exists()
    for batch in batches:
        check_batch_invariants(batch)
        assert batch.env_steps() == 5
    got = sorted(v for b in batches for v in rewards_per_trajectory(b).values())
    assert got == sorted(v for t in totals for v in t.values())


def test_serve_refuses_bad_setups(capsys, monkeypatch):
    monkeypatch.delenv("MARL_RUNNER_TOKEN", raising=False)
    assert main(["serve", str(CONFIG), "--host", "0.0.0.0"]) == 2
    assert "not a loopback address: give a shared token" in capsys.readouterr().err
    assert main(["serve", str(CONFIG), "--set", "vectorize=sync"]) == 2
    assert "serve needs `vectorize: external`" in capsys.readouterr().err


def test_the_summary_is_titled_serving_and_counts_one_of_each_in_the_singular(tmp_path):
    import io

    from rich.console import Console

    from marl_runner.cli.serve import _print_summary
    from marl_runner.progress import SampleCounts

    console = Console(file=io.StringIO(), width=120)
    counts = SampleCounts(env_steps=1, agent_steps=1, episodes=1, batches=1, elapsed_s=1.0)
    _print_summary(console, {"episodes": 1}, counts, tmp_path, None, uploaded=1)
    text = console.file.getvalue()
    assert "serving metrics" in text and "sampling metrics" not in text, text
    assert "1 batch came from local-inference clients" in text, text
    assert f"wrote 1 batch (1 episode, 1 env step) to {tmp_path}" in text, text


def test_the_last_progress_line_is_printed_once_and_counts_in_the_singular() -> None:
    import io

    from rich.console import Console

    from marl_runner.cli.serve import _ServeLines
    from marl_runner.progress import SampleCounts

    console = Console(file=io.StringIO(), width=120)
    counts = SampleCounts(env_steps=1, agent_steps=1, episodes=1, batches=1, elapsed_s=2.0)
    with _ServeLines(console, interval_s=3600) as lines:
        lines._show(counts)  # printed: the first line comes at once
    assert console.file.getvalue() == "serving: 1 env step, 1 episode, 0 env steps/s, 2.0s elapsed\n"
    console = Console(file=io.StringIO(), width=120)
    with _ServeLines(console, interval_s=3600) as lines:
        lines._show(counts)
        counts.env_steps, counts.episodes = 50, 2
        lines._show(counts)  # kept for the last line
    assert console.file.getvalue().splitlines()[-1].startswith("serving: 50 env steps, 2 episodes,")
    assert len(console.file.getvalue().splitlines()) == 2


def test_serve_keeps_its_startup_objects_out_of_full_collections() -> None:
    """A full collection over everything serve imported (torch included) stalls every request
    for about 100 ms; serve freezes what exists once it is set up, so one scans only what came
    since. Checked from inside the serve process, with the clients' requests on the way."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True))\n"
        "from marl_runner.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", probe, "serve", str(CONFIG), "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        lines = []
        for line in server.stdout:
            lines.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if found:
                with PolicyClient(found.group(1)) as client:
                    play(client, 20, seed=0)
                break
        server.send_signal(signal.SIGTERM)
        output = "".join(lines) + server.communicate(timeout=60)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, output
    frozen = int(re.search(r"^frozen (\d+)$", output, re.M).group(1))
    assert frozen > 50_000, output  # modules, torch and the runner: far more than this
