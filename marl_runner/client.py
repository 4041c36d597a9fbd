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
`update_interval_s`, and only experience batches go to the server. Thread-safe
in both modes; bodies use the safe binary codec (never pickle). An unknown or
finished episode id raises `ValueError`, as in-process.
"""

from __future__ import annotations

import os
from typing import Any

from marl_runner.serving.transport import HttpTransport, PolicyServerError

__all__ = ["PolicyClient", "PolicyServerError"]

INFERENCE_MODES = ("remote", "local")


class PolicyClient:
    """Talks to a policy server at `address` (`http://HOST:PORT`).

    Args:
        address: the server's address.
        inference_mode: "remote" (the server computes actions) or "local".
        update_interval_s: "local" only: seconds between weight pulls.
        token: the server's shared token (default: `MARL_RUNNER_TOKEN`).
        timeout_s: socket timeout per request; None waits as long as it takes.
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "remote",
        update_interval_s: float = 10.0,
        token: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if inference_mode not in INFERENCE_MODES:
            raise ValueError(f"inference_mode {inference_mode!r}: expected one of {list(INFERENCE_MODES)}")
        if not update_interval_s > 0:
            raise ValueError(f"update_interval_s {update_interval_s!r}: expected a number > 0")
        self.address = address
        self.inference_mode = inference_mode
        self._transport = HttpTransport(
            address, token if token is not None else os.environ.get("MARL_RUNNER_TOKEN"), timeout_s
        )
        self._local = None
        if inference_mode == "local":
            from marl_runner.serving.local_inference import LocalInference

            self._local = LocalInference(self._transport, update_interval_s)

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        if self._local is not None:
            return self._local.env.start_episode(episode_id, training_enabled)
        body: dict[str, Any] = {"training_enabled": training_enabled}
        if episode_id is not None:
            body["episode_id"] = episode_id
        return self._transport.post("start_episode", body)["episode_id"]

    def get_action(self, episode_id: str, obs: dict) -> dict:
        if self._local is not None:
            return self._local.env.get_action(episode_id, obs)
        return self._transport.post("get_action", {"episode_id": episode_id, "obs": obs})["actions"]

    def log_action(self, episode_id: str, obs: dict, actions: dict) -> None:
        if self._local is not None:
            self._local.env.log_action(episode_id, obs, actions)
            return
        self._transport.post("log_action", {"episode_id": episode_id, "obs": obs, "actions": actions})

    def log_returns(self, episode_id: str, rewards: dict, infos: dict | None = None) -> None:
        if self._local is not None:
            self._local.env.log_returns(episode_id, rewards, infos)
            return
        self._transport.post("log_returns", {"episode_id": episode_id, "rewards": rewards, "infos": infos})

    def end_episode(self, episode_id: str, obs: dict, truncated: bool = False) -> None:
        if self._local is not None:
            self._local.env.end_episode(episode_id, obs, truncated)
            return
        self._transport.post("end_episode", {"episode_id": episode_id, "obs": obs, "truncated": truncated})

    @property
    def local_runner(self) -> Any:
        """"local" mode: the in-client EnvRunner (None in "remote" mode)."""
        return None if self._local is None else self._local.runner

    def close(self) -> None:
        """Stops local inference (sending the batches already built) and closes connections."""
        if self._local is not None:
            self._local.close()
        self._transport.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
