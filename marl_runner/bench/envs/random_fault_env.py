"""RandomFaultEnv: faults at random, for soak runs."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from marl_runner.bench.envs.scripted_env import ScriptedEnv, every_round_script
from marl_runner.envs.multi_agent_env import MultiAgentDict, StepResult

FAULT_KINDS = ("raise", "reset", "exit", "hang")


class CrashingEnvError(RuntimeError):
    """The exception the fault envs raise on cue (picklable, so it crosses processes);
    the tests' CrashingEnv raises it too."""


class RandomFaultEnv(ScriptedEnv):
    """Two agents acting every round; each step fails with probability `fault_rate`.

    A fault is drawn from `kinds`: `raise` (CrashingEnvError in step),
    `reset` (the episode goes on, its next reset raises), `exit` (`os._exit`: only in worker
    processes) or `hang` (sleeps `hang_s`, past a short step timeout). A
    complete episode gives a0 exactly `0.1 * episode_len` and a1 twice that,
    so a soak can check every episode it gets back. Unseeded faults: each
    instance (and each recreated one) draws its own.
    """

    def __init__(
        self,
        fault_rate: float = 0.01,
        kinds: Sequence[str] = FAULT_KINDS,
        episode_len: int = 20,
        hang_s: float = 60.0,
    ) -> None:
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"RandomFaultEnv kinds {unknown}: expected some of {FAULT_KINDS}")
        super().__init__(every_round_script(("a0", "a1"), episode_len), ("a0", "a1"))
        self.fault_rate = fault_rate
        self.kinds = tuple(kinds)
        self.hang_s = hang_s
        self._faults = np.random.default_rng()
        self._fail_next_reset = False

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if self._fail_next_reset:
            self._fail_next_reset = False
            raise CrashingEnvError("RandomFaultEnv: planned crash in reset")
        return super().reset(seed=seed, options=options)

    def step(self, actions: MultiAgentDict) -> StepResult:
        if self.kinds and self._faults.random() < self.fault_rate:
            kind = self.kinds[self._faults.integers(len(self.kinds))]
            if kind == "exit":
                os._exit(3)
            if kind == "hang":
                time.sleep(self.hang_s)
            elif kind == "reset":
                self._fail_next_reset = True  # this episode goes on; its reset fails
                return super().step(actions)
            raise CrashingEnvError(f"RandomFaultEnv: planned {kind} fault in step")
        return super().step(actions)
