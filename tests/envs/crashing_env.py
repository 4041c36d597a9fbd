"""CrashingEnv: fails in step or reset on cue, to test fault isolation."""

from __future__ import annotations

import os
import time
from typing import Any, Literal

from marl_runner.bench.envs.random_fault_env import CrashingEnvError
from marl_runner.bench.envs.scripted_env import ScriptedEnv, every_round_script
from marl_runner.envs.multi_agent_env import MultiAgentDict, StepResult

__all__ = ["CrashingEnv", "CrashingEnvError"]


class CrashingEnv(ScriptedEnv):
    """Two agents acting every round; `step` raises at a chosen episode step.

    Args:
        crash_step: the step call (1-based, within an episode) that raises;
            None never crashes in step.
        step_crashes: how many step crashes this instance makes before it
            behaves (None: every episode crashes).
        reset_crashes: how many of this instance's first resets raise.
        episode_len: rounds per episode when no crash happens.
        hard_exit: make the step crash end the whole process (`os._exit`)
            instead of raising, to test how a vector env survives a dead
            worker process. Never use it in the runner's own process.
        fault: how the step crash happens: `raise` (CrashingEnvError),
            `exit` (as `hard_exit`), `hang` (sleep `hang_s` seconds, then go
            on normally: a simulator stuck past a timeout) or `interrupt`
            (KeyboardInterrupt raised from inside the step, as a Ctrl-C
            landing in env code does).
        hang_s: how long a `hang` lasts.
        fault_token: a file path; a step crash happens only in the instance
            that creates this file first, so a run (all its sub-envs,
            processes and recreated envs together) sees exactly one.

    A crash leaves the episode state untouched. Counters belong to the
    instance, so a recreated env crashes afresh.
    """

    def __init__(
        self,
        crash_step: int | None = 3,
        step_crashes: int | None = None,
        reset_crashes: int = 0,
        episode_len: int = 10,
        hard_exit: bool = False,
        fault: Literal["raise", "exit", "hang", "interrupt"] = "raise",
        hang_s: float = 3600.0,
        fault_token: str | None = None,
    ) -> None:
        if fault not in ("raise", "exit", "hang", "interrupt"):
            raise ValueError(
                f"CrashingEnv fault {fault!r}: expected raise, exit, hang or interrupt"
            )
        super().__init__(every_round_script(("a0", "a1"), episode_len), ("a0", "a1"))
        self.crash_step = crash_step
        self.step_crashes = step_crashes
        self.reset_crashes = reset_crashes
        self.fault = "exit" if hard_exit else fault
        self.hang_s = hang_s
        self.fault_token = fault_token
        self.num_resets = 0
        self.num_step_crashes = 0

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        self.num_resets += 1
        if self.num_resets <= self.reset_crashes:
            raise CrashingEnvError(f"CrashingEnv: planned crash in reset #{self.num_resets}")
        return super().reset(seed=seed, options=options)

    def step(self, actions: MultiAgentDict) -> StepResult:
        crashes_left = self.step_crashes is None or self.num_step_crashes < self.step_crashes
        if self._round + 1 == self.crash_step and crashes_left and self._claim_fault():
            self.num_step_crashes += 1
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "interrupt":
                raise KeyboardInterrupt(f"CrashingEnv: planned interrupt in step {self.crash_step}")
            if self.fault == "hang":
                time.sleep(self.hang_s)
            else:
                raise CrashingEnvError(f"CrashingEnv: planned crash in step {self.crash_step}")
        return super().step(actions)

    def _claim_fault(self) -> bool:
        if self.fault_token is None:
            return True
        try:
            os.close(os.open(self.fault_token, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True
