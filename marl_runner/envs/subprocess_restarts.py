"""SubprocessVectorEnv's fault bookkeeping: which sub-envs must be recreated, which
were recreated without a reset, and the errors that say why a sub-env failed."""

from __future__ import annotations

from marl_runner.envs.base_env import EnvID, ResetSeeds
from marl_runner.envs.errors import EnvError, SubEnvTimeoutError
from marl_runner.envs.multi_agent_env import MultiAgentDict


class RestartBook:
    """Sub-envs to recreate before their next reset (`crashed`, restarts on only) and
    sub-envs recreated with their worker but not reset since (`stale`)."""

    def __init__(self, restart_failed: bool, seeds: ResetSeeds) -> None:
        self.restart_failed = restart_failed
        self.seeds = seeds
        self.crashed: set[EnvID] = set()
        #: Sub-envs of a recreated worker not reset since: stepping one fails it.
        self.stale: set[EnvID] = set()

    def failed(self, env_id: EnvID) -> None:
        """Note a failure: with restarts on, the sub-env is recreated before its next reset."""
        if self.restart_failed:
            self.crashed.add(env_id)

    def worker_lost(self, env_ids: list[EnvID]) -> None:
        """A dead worker fails all its sub-envs: with restarts on, each is recreated."""
        if self.restart_failed:
            self.crashed.update(env_ids)

    def recreated(self, env_ids: list[EnvID], unreset: list[EnvID] = ()) -> None:
        """`env_ids` are new env objects (seeded afresh at their first reset); `unreset`
        of them were recreated only because their worker was, and fail if stepped."""
        for env_id in env_ids:
            self.seeds.recreated(env_id)
            self.crashed.discard(env_id)
        self.stale.update(unreset)

    def split_stale(
        self, request: list[tuple[EnvID, MultiAgentDict]], worker_index: int
    ) -> tuple[list[tuple[EnvID, MultiAgentDict]], list[tuple[EnvID, EnvError]]]:
        """The step request without its stale sub-envs, and the failure of each of those."""
        stale = self.stale
        if not stale:
            return request, []
        failures = [
            (
                env_id,
                EnvError(
                    f"sub-env {env_id} was recreated with its worker {worker_index} (after "
                    "another of its sub-envs failed) and stepped without a reset; its "
                    "episode is dropped"
                ),
            )
            for env_id, _ in request
            if env_id in stale
        ]
        return [item for item in request if item[0] not in stale], failures


def lost_worker_error(
    env_id: EnvID, reason: str, worker_index: int, hung: EnvID | None
) -> EnvError:
    """Why `env_id`, in the unanswered request of a killed worker, failed.

    `hung`: the sub-env that timed out (None: the worker died on its own).
    """
    if hung is None:
        return EnvError(reason)
    if env_id == hung:
        return SubEnvTimeoutError(reason)
    return EnvError(
        f"sub-env {env_id}: its episode is dropped because its worker {worker_index} "
        f"was killed: {reason}"
    )


def timeout_reason(
    hung_id: int, call: str, step_timeout_s: float, worker_description: str
) -> str:
    """Why a worker was killed after its env call (or its request) ran out of time."""
    limit = f"sub_env_step_timeout_s={step_timeout_s:g}"
    if hung_id >= 0:
        return (
            f"sub-env {hung_id} took longer than {limit} s in {call} (or the reset after "
            f"its last step); its {worker_description} was killed"
        )
    return f"{worker_description} did not answer a {call} request within {limit} s; killed"
