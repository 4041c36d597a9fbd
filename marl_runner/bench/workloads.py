"""The benchmark workloads: one runner config each, shared by the runner and the bare loop.

Both sides of a comparison are built from the same ``RunnerConfig``, so the
env, number of sub-envs, seeds, policies and model sizes cannot drift apart.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from marl_runner.config import RunnerConfig

MLP = {"type": "mlp", "hidden": [64, 64]}


@dataclass(frozen=True)
class Workload:
    """A named runner config plus the ratio target the issue sets for it (against the bare
    loop with the numpy forward pass)."""

    name: str
    description: str
    env: dict[str, Any]
    num_envs: int
    policies: tuple[str, ...]
    policy_mapping_fn: dict[str, str] | None
    target_ratio: float | None
    #: Caps the rollout fragment length: image obs make 200-step fragments huge.
    max_fragment_length: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def config(
        self,
        *,
        vectorize: str = "sync",
        num_workers: int | None = None,
        seed: int = 0,
        rollout_fragment_length: int = 200,
        torch_threads: int = 1,
        async_poll: bool = False,
    ) -> RunnerConfig:
        """The runner config; defaults everywhere else (default connector chains, CPU).

        ``torch_threads`` is process-wide (the runner limits torch's and BLAS's threads),
        so the bare loop in the same process runs with the same setting.
        """
        data: dict[str, Any] = {
            "env": copy.deepcopy(self.env),
            "num_envs": self.num_envs,
            "vectorize": vectorize,
            "rollout_fragment_length": min(
                rollout_fragment_length, self.max_fragment_length or rollout_fragment_length
            ),
            "seed": seed,
            "device": "cpu",
            "torch_threads": torch_threads,
            "policies": {pid: {"model": dict(MLP)} for pid in self.policies},
            "policy_mapping_fn": self.policy_mapping_fn,
            **copy.deepcopy(self.extra),
        }
        if vectorize == "subprocess" and num_workers is not None:
            data["num_workers"] = min(num_workers, self.num_envs)
        if vectorize == "subprocess" and async_poll:
            data["async_poll"] = True
        return RunnerConfig.from_dict(data)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="cheap",
            description="CheapEnv: 8 agents, 16-dim obs, Discrete(5), 100-step episodes, "
            "2 policies by agent parity",
            env={
                "name": "marl_runner.bench.envs.cheap_env:CheapEnv",
                "config": {"num_agents": 8, "episode_len": 100, "obs_dim": 16, "num_actions": 5},
                "api": "multi_agent",
            },
            num_envs=64,
            policies=("even", "odd"),
            policy_mapping_fn={"agent_*[02468]": "even", "agent_*": "odd"},
            target_ratio=0.9,
        ),
        Workload(
            name="spread",
            description="mpe2 simple_spread_v3: 3 agents, one shared policy",
            env={
                "name": "mpe2.simple_spread_v3:parallel_env",
                "config": {"N": 3, "max_cycles": 25, "continuous_actions": False},
                "api": "parallel",
            },
            num_envs=16,
            policies=("shared",),
            policy_mapping_fn=None,
            target_ratio=0.93,
        ),
        Workload(
            name="kaz",
            description="knights_archers_zombies_v11 (vector obs): agents die; "
            "archer and knight policies",
            env={
                "name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
                "config": {"obs_method": "vector"},
                "api": "parallel",
            },
            num_envs=8,
            policies=("archer", "knight"),
            policy_mapping_fn={"archer_*": "archer", "knight_*": "knight"},
            target_ratio=0.93,
        ),
        Workload(
            name="connect_four",
            description="connect_four_v3 (AEC, action masks): one policy per seat",
            env={"name": "pettingzoo.classic.connect_four_v3:env", "config": {}, "api": "aec"},
            num_envs=32,
            policies=("player_0", "player_1"),
            policy_mapping_fn={"player_0": "player_0", "player_1": "player_1"},
            target_ratio=0.93,
        ),
        Workload(
            name="pistonball",
            description="pistonball_v6 (20 pistons, image obs, discrete): env-bound, "
            "used by the subprocess comparison only",
            env={
                "name": "pettingzoo.butterfly.pistonball_v6:parallel_env",
                "config": {"continuous": False, "n_pistons": 20, "max_cycles": 125},
                "api": "parallel",
            },
            num_envs=4,
            policies=("piston",),
            policy_mapping_fn=None,
            target_ratio=None,
            # 4 envs x 20 pistons x 10 steps = 800 rows of 457x120x3 float32 obs: ~0.5 GB per
            # column (obs, new_obs) per batch. At 200 steps a batch would need ~20 GB.
            max_fragment_length=10,
        ),
        Workload(
            name="battle",
            description="MAgent2 battle_v4 (map 45, 200 cycles): 162 agents, 13x13x5 obs, "
            "agents die; red and blue policies by prefix",
            env={
                "name": "magent2.environments.battle_v4:parallel_env",
                "config": {"map_size": 45, "max_cycles": 200},
                "api": "parallel",
            },
            num_envs=2,
            policies=("red", "blue"),
            policy_mapping_fn={"red_*": "red", "blue_*": "blue"},
            target_ratio=0.85,
            max_fragment_length=100,
        ),
        Workload(
            name="cheap512",
            description="CheapEnv with 512 agents, 16-dim obs, 100-step episodes, "
            "2 policies by agent parity",
            env={
                "name": "marl_runner.bench.envs.cheap_env:CheapEnv",
                "config": {"num_agents": 512, "episode_len": 100, "obs_dim": 16, "num_actions": 5},
                "api": "multi_agent",
            },
            num_envs=2,
            policies=("even", "odd"),
            policy_mapping_fn={"agent_*[02468]": "even", "agent_*": "odd"},
            target_ratio=0.9,
            max_fragment_length=100,
        ),
    )
}

#: What a plain ``bench`` run measures (the issue's four workloads).
DEFAULT_WORKLOADS = ("cheap", "spread", "kaz", "connect_four")
#: Env-bound workloads for the subprocess-vs-sync comparison.
SUBPROCESS_WORKLOADS = ("kaz", "pistonball")
#: The workload of the memory-growth check.
MEMORY_WORKLOAD = "cheap"
#: What ``--population`` measures: many agents per env.
POPULATION_WORKLOADS = ("battle", "cheap512")


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; expected one of {sorted(WORKLOADS)}"
        ) from None
