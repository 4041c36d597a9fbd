"""The output checks of a worker's step results, run once per request where they can.

`EnvOutputCheck.step` (see `checks`) checks one sub-env's result: every key of
its obs, reward and flag dicts is an agent the env declares, and the rewards
are finite. Per sub-env that costs more than a cheap env's step. But a key
tuple that passed once passes again (the declared agents only grow), so a
worker stepping the same sub-envs round after round only needs to see that
their keys equal those it cleared last time (the same keys in the same order,
compared as the flat list of `ReplyColumns.keys`, which the slot-block writer
reads too) and that the sum of all their rewards is finite; anything else
gets the per-sub-env checks, which name what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marl_runner.envs.base_env import EnvID
from marl_runner.envs.checks import EnvOutputCheck, rewards_fit
from marl_runner.envs.errors import EnvError
from marl_runner.envs.reply_columns import REWARDS, ReplyColumns
from marl_runner.envs.subprocess_protocol import Crash, Malformed

#: Requests (sub-env id tuples) whose cleared key tuples are kept.
_MAX_CLEARED = 64


class RequestChecks:
    """Checks the results of one worker's step requests, remembering what it cleared."""

    def __init__(
        self,
        checks: dict[EnvID, EnvOutputCheck],
        check_spaces: bool,
        crash: Callable[[BaseException, EnvID], Crash],
    ) -> None:
        self._checks = checks
        self._check_spaces = check_spaces
        self._crash = crash
        #: Sub-env ids of a request -> the keys of their results (`ReplyColumns.keys`, infos'
        #: too) that last passed for them.
        self._cleared: dict[tuple[EnvID, ...], tuple[list, list[int]]] = {}

    def forget(self) -> None:
        """Check every key tuple afresh (a sub-env was recreated: its env may declare
        other agents)."""
        self._cleared.clear()

    def check_one(self, env_id: EnvID, result: list) -> Any:
        """`result` if it passes the checks, else the Malformed (or Crash) entry for it."""
        try:
            self._checks[env_id].step(*result[:4])
        except EnvError as error:
            return Malformed(str(error))
        except BaseException as error:  # as for the env's own step: the env's doing
            return self._crash(error, env_id)
        return result

    def check_many(
        self, env_ids: Sequence[EnvID], results: list[Any], columns: ReplyColumns | None = None
    ) -> bool:
        """Check the step results of sub-envs `env_ids`, replacing each that fails with its
        Malformed (or Crash) entry, in place; True when all passed. `columns`: the
        results' columns, where the caller has them (the writer reads them next)."""
        if not env_ids:
            return True
        if columns is None:
            columns = ReplyColumns(results)
        keys = columns.keys()
        request = tuple(env_ids)
        if (
            not self._check_spaces
            and keys == self._cleared.get(request)
            and rewards_fit(columns.values(REWARDS))
        ):
            return True
        passed = True
        for n, (env_id, result) in enumerate(zip(env_ids, results)):
            checked = self.check_one(env_id, result)
            if checked is not result:
                results[n] = checked
                passed = False
        if passed:
            if len(self._cleared) >= _MAX_CLEARED:  # async pools: requests of many subsets
                self._cleared.clear()
            self._cleared[request] = keys
        return passed
