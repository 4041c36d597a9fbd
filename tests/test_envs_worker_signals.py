"""Env workers leave Ctrl-C and SIGTERM to the runner's process, without handing that on:
a process a sub-env starts still stops on SIGTERM (an ignored signal would stay ignored
in it through exec)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.bench.envs.cheap_env import CheapEnv


class StopsAChild(CheapEnv):
    """At reset, starts a child process that sleeps and stops it with ``terminate()``; each
    agent's step infos say whether it stopped."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        child.terminate()
        try:
            self.child_stopped = child.wait(timeout=10) is not None
        except subprocess.TimeoutExpired:
            self.child_stopped = False
            child.kill()
            child.wait()
        return super().reset(seed=seed, options=options)

    def step(self, actions: dict) -> Any:
        obs, rewards, terminateds, truncateds, _ = super().step(actions)
        return obs, rewards, terminateds, truncateds, {a: {"child_stopped": self.child_stopped} for a in obs}


def test_a_sub_env_in_a_worker_can_stop_its_own_child_process() -> None:
    config = RunnerConfig.from_dict({
        "env": {"name": "tests.test_envs_worker_signals:StopsAChild", "api": "multi_agent",
                "config": {"num_agents": 2, "episode_len": 3}},
        "num_envs": 2, "vectorize": "subprocess", "num_workers": 2, "rollout_fragment_length": 3,
        "policies": {"p": {"model": {"type": "mlp", "hidden": [4]}}},
    })
    with EnvRunner(config) as runner:
        infos: list[Any] = list(runner.sample().policy_batches["p"]["infos"])
    reported = [info["child_stopped"] for info in infos if "child_stopped" in info]
    assert reported and all(reported)
