"""The bare loop: the least work that samples the workload at all.

It is the yardstick the runner is compared with, so it does only what any
sampler must do and nothing else: per round, poll the vector env, group the
obs of agents that must act by policy, stack them once per policy (numpy),
run ONE forward pass per policy, sample actions (honouring action masks),
split them back into per-env action dicts, send them, and reset sub-envs
whose episodes ended. No trajectories, no batches, no connectors, no
episode bookkeeping.

Fairness: it uses the SAME vector env code as the runner
(``marl_runner.envs.make_vector_env`` on the runner's own config, so same env
wrappers, same seeds, same number of sub-envs, same ``poll`` checks), the
same torch model class and sizes (``marl_runner.policy.models.build_model``
with the policy's ``model`` config), and ``torch.inference_mode``. Actions
are drawn by Gumbel-max like the runner's ``CategoricalHead``. With
``forward="numpy"`` the model runs in numpy instead (``NumpyMLP``, the
runner's own CPU path for the built-in mlp) and the draw too: the yardstick
for the runner's bookkeeping alone, with both forward passes alike.

Agent steps: one per action sent, i.e. one per agent observation acted on.
Each such action becomes exactly one transition in the runner, which counts
closed transitions (``num_agent_steps``); over a timed window the two counts
differ by at most the actions in flight at its edges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from marl_runner.config import RunnerConfig
from marl_runner.envs import BaseEnv, make_vector_env
from marl_runner.mapping import infer_policy_spaces, make_policy_mapping_fn
from marl_runner.policy.models import build_model
from marl_runner.policy.numpy_mlp import NumpyMLP
from marl_runner.policy_setup import policy_seed

#: Phases timed in the bare loop, named like the runner's perf stats.
BARE_PHASES = ("env_wait", "raw_obs_processing", "inference", "action_processing")
#: How the bare loop runs its model: torch (the yardstick the targets are set against)
#: or numpy (as the runner does on CPU for the built-in mlp).
BARE_FORWARDS = ("torch", "numpy")
_TINY = np.finfo(np.float32).tiny


@dataclass
class RunResult:
    """What one timed stretch of the bare loop did."""

    agent_steps: int = 0
    env_steps: int = 0
    rounds: int = 0
    episodes: int = 0
    elapsed_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BARE_PHASES, 0.0))

    def perf_ms(self) -> dict[str, float]:
        """Mean milliseconds per round for each phase (same keys as the runner's perf)."""
        rounds = max(self.rounds, 1)
        return {f"mean_{p}_ms": s * 1000.0 / rounds for p, s in self.phase_s.items()}


class _BarePolicy:
    """One policy's model plus how to turn a list of raw obs into its input."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        model_config: dict,
        seed: int | None,
        forward: str = "torch",
    ) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"the bare loop only handles Discrete actions, got {action_space}")
        self.masked = isinstance(obs_space, gym.spaces.Dict) and "action_mask" in obs_space.spaces
        space = obs_space["observation"] if self.masked else obs_space
        self.obs_dim = int(np.prod(space.shape))
        self.start = int(action_space.start)
        if seed is not None:
            torch.manual_seed(seed)
        self.model = build_model(model_config, self.obs_dim, int(action_space.n)).eval()
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else seed)
        self.numpy_model = NumpyMLP.for_model(self.model) if forward == "numpy" else None
        if forward == "numpy" and self.numpy_model is None:
            raise ValueError(f"the bare loop runs only the built-in mlp in numpy, got {model_config}")
        self.rng = np.random.default_rng(0 if seed is None else seed)

    def prepare(self, obs_list: list) -> tuple[np.ndarray, np.ndarray | None]:
        """Stack once: float32 ``[n, obs_dim]`` (and the ``[n, A]`` mask of Dict obs).

        ``np.asarray(list, float32)`` stacks and casts in one pass; for many
        small rows it is ~3x faster than ``np.stack`` (which checks every row).
        """
        n = len(obs_list)
        if self.masked:
            obs = np.asarray([o["observation"] for o in obs_list], dtype=np.float32)
            mask = np.asarray([o["action_mask"] for o in obs_list], dtype=bool)
        else:
            obs = np.asarray(obs_list, dtype=np.float32)
            mask = None
        return obs.reshape(n, self.obs_dim), mask

    def act(self, obs: np.ndarray, mask: np.ndarray | None) -> list:
        """One forward pass, Gumbel-max sample over the allowed actions; Python ints back."""
        if self.numpy_model is not None:
            return self._act_in_numpy(obs, mask)
        with torch.inference_mode():
            logits, _ = self.model(torch.from_numpy(obs))
            uniform = torch.rand(logits.shape, generator=self.generator).clamp_(min=1e-20)
            scores = logits - torch.log(-torch.log(uniform))
            if mask is not None:
                scores = scores.masked_fill(~torch.from_numpy(mask), -torch.inf)
            actions = scores.argmax(dim=-1)
        if self.start:
            actions = actions + self.start
        return actions.tolist()

    def _act_in_numpy(self, obs: np.ndarray, mask: np.ndarray | None) -> list:
        return self.draw(obs, mask)[0].tolist()

    def draw(
        self, obs: np.ndarray, mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The numpy forward pass and Gumbel-max draw: ``(actions, logits, values)``."""
        logits, values = self.numpy_model(obs)
        uniform = self.rng.random(logits.shape, dtype=np.float32)
        np.maximum(uniform, _TINY, out=uniform)
        scores = logits - np.log(-np.log(uniform))
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        actions = scores.argmax(axis=1)
        return (actions + self.start if self.start else actions), logits, values


class BareLoop:
    """The bare loop over its own vector env, built from the runner's config."""

    def __init__(self, config: RunnerConfig, forward: str = "torch") -> None:
        if forward not in BARE_FORWARDS:
            raise ValueError(f"forward must be one of {list(BARE_FORWARDS)}, got {forward!r}")
        self.config = config
        self.env: BaseEnv = make_vector_env(config)
        mapping = make_policy_mapping_fn(config.policy_mapping_fn, list(config.policies))
        self._policy_of: dict[Any, str] = {}
        self._mapping: Callable[..., str] = mapping
        spaces = infer_policy_spaces(
            self.env.possible_agents,
            self._lookup,
            self.env.get_observation_space,
            self.env.get_action_space,
        )
        self.policies: dict[str, _BarePolicy] = {
            pid: _BarePolicy(
                obs_space,
                act_space,
                config.policies[pid]["model"],
                policy_seed(config.seed, pid),
                forward,
            )
            for pid, (obs_space, act_space, _) in spaces.items()
        }
        self._pending: dict[int, dict] = {}
        self._started = False

    def _lookup(self, agent_id: Any) -> str:
        """Mapping fn once per agent id (fixed mappings in every workload)."""
        policy_id = self._policy_of.get(agent_id)
        if policy_id is None:
            policy_id = self._policy_of[agent_id] = self._mapping(agent_id, None)
        return policy_id

    def run(self, *, duration_s: float = 0.0, min_rounds: int = 1) -> RunResult:
        """Rounds until ``duration_s`` passed and at least ``min_rounds`` were done."""
        result = RunResult()
        phase = result.phase_s
        env = self.env
        policy_of = self._policy_of
        lookup = self._lookup
        policies = self.policies
        start = perf_counter()
        while True:
            t0 = perf_counter()
            if self._started:
                env.send_actions(self._pending)
            self._started = True
            obs, _, terminateds, truncateds, _, _ = env.poll()
            t1 = perf_counter()
            groups: dict[str, tuple[list, list, list]] = {pid: ([], [], []) for pid in policies}
            actions: dict[int, dict] = {}
            for env_id, env_obs in obs.items():
                if isinstance(env_obs, BaseException):
                    raise RuntimeError(f"sub-env {env_id} failed in the bare loop") from env_obs
                env_terminateds = terminateds[env_id]
                env_truncateds = truncateds[env_id]
                if env_terminateds["__all__"] or env_truncateds["__all__"]:
                    # Timed as obs processing, as in the runner's perf stats.
                    reset = env.try_reset(env_id)
                    result.episodes += 1
                    if reset is None:  # asynchronous reset: its obs come in a later poll
                        continue
                    env_obs = reset[0]
                    if isinstance(env_obs, BaseException):
                        raise RuntimeError(f"sub-env {env_id} failed to reset") from env_obs
                    env_terminateds = env_truncateds = {}
                else:
                    result.env_steps += 1
                actions[env_id] = {}
                for agent_id, agent_obs in env_obs.items():
                    if env_terminateds.get(agent_id) or env_truncateds.get(agent_id):
                        continue
                    policy_id = policy_of.get(agent_id) or lookup(agent_id)
                    group = groups[policy_id]
                    group[0].append(agent_obs)
                    group[1].append(env_id)
                    group[2].append(agent_id)
            inputs = {
                pid: policies[pid].prepare(group[0]) for pid, group in groups.items() if group[0]
            }
            t2 = perf_counter()
            chosen = {pid: policies[pid].act(*inputs[pid]) for pid in inputs}
            t3 = perf_counter()
            for pid, group_actions in chosen.items():
                _, env_ids, agent_ids = groups[pid]
                for env_id, agent_id, action in zip(env_ids, agent_ids, group_actions):
                    actions[env_id][agent_id] = action
                result.agent_steps += len(group_actions)
            self._pending = actions
            t4 = perf_counter()
            phase["env_wait"] += t1 - t0
            phase["raw_obs_processing"] += t2 - t1
            phase["inference"] += t3 - t2
            phase["action_processing"] += t4 - t3
            result.rounds += 1
            if result.rounds >= min_rounds and t4 - start >= duration_s:
                break
        result.elapsed_s = perf_counter() - start
        return result

    def stop(self) -> None:
        """Ends the vector env (its worker processes, when it has any)."""
        self.env.stop()
