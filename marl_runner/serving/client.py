"""`PolicyClient`: the five external-env calls against a `marl-runner serve` server.

```python
from marl_runner.client import PolicyClient
client = PolicyClient("http://127.0.0.1:9900")          # inference_mode="remote"
eid = client.start_episode()
actions = client.get_action(eid, {"a0": obs})
client.log_returns(eid, {"a0": 1.0})
client.end_episode(eid, {"a0": last_obs})
```

`inference_mode="remote"`: every call is one HTTP request; the server's
runner batches concurrent `get_action` requests into one forward pass.
`inference_mode="local"`: the policies and connectors run here (an EnvRunner
over an in-client external env), weights and connector state are pulled every
`update_interval_s`, and only experience batches go to the server; every
value a call takes is checked at the call by the server's own checks
(`validation.CallValues`), so one the server would refuse raises
`ValueError` there and nothing already logged is lost. Thread-safe in both
modes; bodies use the safe binary codec (never pickle). An unknown or
finished episode id raises `ValueError`, as in-process.

Connection failures and retries: `marl_runner.serving.transport`.
"""

from __future__ import annotations

import os
from typing import Any

from marl_runner.serving.transport import (
    DEFAULT_BACKOFF_S,
    DEFAULT_RETRIES,
    HttpTransport,
    PolicyServerError,
    PolicyServerUnavailable,
)

__all__ = ["PolicyClient", "PolicyServerError", "PolicyServerUnavailable"]

INFERENCE_MODES = ("remote", "local")


class PolicyClient:
    """Talks to a policy server at `address` (`http://HOST:PORT`).

    Args:
        address: the server's address.
        inference_mode: "remote" (the server computes actions) or "local".
        update_interval_s: "local" only: seconds between weight pulls.
        token: the server's shared token (default: `MARL_RUNNER_TOKEN`).
        timeout_s: socket timeout per request; None waits as long as it takes.
        retries: how many more attempts a call that cannot act twice gets.
        backoff_s: the wait before the first retry; it doubles on each one.
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "remote",
        update_interval_s: float = 10.0,
        token: str | None = None,
        timeout_s: float | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
    ) -> None:
        if inference_mode not in INFERENCE_MODES:
            raise ValueError(f"inference_mode {inference_mode!r}: expected one of {list(INFERENCE_MODES)}")
        if not update_interval_s > 0:
            raise ValueError(f"update_interval_s {update_interval_s!r}: expected a number > 0")
        self.address = address
        self.inference_mode = inference_mode
        self._transport = HttpTransport(
            address,
            token if token is not None else os.environ.get("MARL_RUNNER_TOKEN"),
            timeout_s,
            retries=retries,
            backoff_s=backoff_s,
        )
        self._local = None
        if inference_mode == "local":
            from marl_runner.serving.local_inference import LocalInference

            self._local = LocalInference(self._transport, update_interval_s)

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Opens an episode (waiting for a free slot) and returns its id, new when None.

        `training_enabled=False`: played as usual, but none of its rows are written.
        """
        if self._local is not None:
            return self._local.env.start_episode(episode_id, training_enabled)
        body: dict[str, Any] = {"training_enabled": training_enabled}
        if episode_id is not None:
            body["episode_id"] = episode_id
        return self._transport.post("start_episode", body)["episode_id"]

    def get_action(self, episode_id: str, obs: dict) -> dict:
        """Actions of the agents in `obs`; rewards logged since the last step go to the last ones."""
        if self._local is not None:
            return self._local.env.get_action(episode_id, self._local.values.obs(obs))
        return self._transport.post("get_action", {"episode_id": episode_id, "obs": obs})["actions"]

    def log_action(self, episode_id: str, obs: dict, actions: dict) -> None:
        """Records actions the simulator chose itself (off-policy); one env step, no answer."""
        if self._local is not None:
            values = self._local.values
            self._local.env.log_action(episode_id, values.obs(obs), values.actions(actions))
            return
        self._transport.post("log_action", {"episode_id": episode_id, "obs": obs, "actions": actions})

    def log_returns(self, episode_id: str, rewards: dict, infos: dict | None = None) -> None:
        """Adds rewards (and infos) for the agents' last actions, summed until the next step."""
        if self._local is not None:
            values = self._local.values
            self._local.env.log_returns(episode_id, values.rewards(rewards), values.infos(infos))
            return
        self._transport.post("log_returns", {"episode_id": episode_id, "rewards": rewards, "infos": infos})

    def end_episode(self, episode_id: str, obs: dict, truncated: bool = False) -> None:
        """Ends the episode with its final obs; `truncated=True` for a time limit.

        In "local" mode the finished episode is uploaded in the background,
        and `close()` waits until it is.
        """
        if self._local is not None:
            obs = self._local.values.obs(obs, allow_empty=True)
            self._local.env.end_episode(episode_id, obs, truncated)
            return
        self._transport.post("end_episode", {"episode_id": episode_id, "obs": obs, "truncated": truncated})

    def health(self) -> dict:
        """The server's `GET /v1/health` (`{"ok": true, "running_episodes": N, "process": PID}`);
        retried."""
        return self._transport.get("health")

    @property
    def episodes_uploaded(self) -> int:
        """"local" mode: finished episodes the server has accepted so far (0 in "remote" mode)."""
        return 0 if self._local is None else self._local.episodes_sent

    @property
    def local_runner(self) -> Any:
        """"local" mode: the in-client EnvRunner (None in "remote" mode)."""
        return None if self._local is None else self._local.runner

    def close(self) -> None:
        """Closes connections; "local" mode first uploads every episode ended so far.

        Episodes still running in "local" mode are abandoned (never uploaded).
        Raises the upload's error if an episode could not be sent.
        """
        if self._local is not None:
            self._local.close()
        self._transport.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
