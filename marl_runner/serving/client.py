"""`PolicyClient`: the five external-env calls against a `marl-runner serve` server.

```python
from marl_runner.client import PolicyClient
client = PolicyClient("http://127.0.0.1:9900")          # inference_mode="remote"
eid = client.start_episode()
actions = client.get_action(eid, {"a0": obs})
client.log_returns(eid, {"a0": 1.0})
client.end_episode(eid, {"a0": last_obs})
```

"remote": one request per env step; a `log_returns` is checked at the call and
rides on the episode's next one, applied at most once. "local": policies run
here, only experience goes up. Both check every value at the call, are
thread-safe and never pickle (docs/SERVING.md).
"""

from __future__ import annotations

import copy
import os
import threading
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
# Open episodes a remote-mode client keeps a queue for; past this, the oldest idle one is
# forgotten (one abandoned must not be kept forever): its log_returns are then sent at once.
MAX_OPEN_EPISODES = 10_000


class PolicyClient:
    """Talks to a policy server at `address` (`http://HOST:PORT`).

    Args:
        address: the server's address.
        inference_mode: "remote" (the server computes actions) or "local".
        update_interval_s: "local" only: seconds between weight pulls.
        token: the server's shared token (default: `MARL_RUNNER_TOKEN`).
        timeout_s: the most one request may take, connecting included (an upload of
            experience too); None waits as long as it takes.
        retries: how many more attempts a call that cannot act twice gets.
        backoff_s: the retries' backoff factor (see `transport.HttpTransport`).
    """

    def __init__(self, address: str, inference_mode: str = "remote", update_interval_s: float = 10.0,
                 token: str | None = None, timeout_s: float | None = None,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = DEFAULT_BACKOFF_S) -> None:
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
        # "remote" mode: each episode this client has open -> [the [rewards, infos] pairs logged
        # since its last call, their reward sums]; oldest first. `_values`: the server's checks.
        self._queued: dict[str, list] = {}
        self._lock = threading.Lock()
        self._values: Any = None
        self._values_lock = threading.Lock()
        if inference_mode == "local":
            from marl_runner.serving.local_inference import LocalInference

            self._local = LocalInference(self._transport, update_interval_s)

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Opens an episode (waiting for a free slot) and returns its id, new when None;
        `training_enabled=False`: played as usual, but none of its rows are written."""
        if self._local is not None:
            return self._local.env.start_episode(episode_id, training_enabled)
        body: dict[str, Any] = {"training_enabled": training_enabled}
        if episode_id is not None:
            body["episode_id"] = episode_id
        episode_id = self._transport.post("start_episode", body)["episode_id"]
        self._open(episode_id)
        return episode_id

    def get_action(self, episode_id: str, obs: dict) -> dict:
        """Actions of the agents in `obs`; rewards logged since the last step go to the last ones."""
        if self._local is not None:
            return self._local.env.get_action(episode_id, self._local.values.obs(obs))
        return self._step("get_action", {"episode_id": episode_id, "obs": obs})["actions"]

    def log_action(self, episode_id: str, obs: dict, actions: dict) -> None:
        """Records actions the simulator chose itself (off-policy); one env step, no answer."""
        if self._local is not None:
            values = self._local.values
            self._local.env.log_action(episode_id, values.obs(obs), values.actions(actions))
            return
        self._step("log_action", {"episode_id": episode_id, "obs": obs, "actions": actions})

    def log_returns(self, episode_id: str, rewards: dict, infos: dict | None = None) -> None:
        """Adds rewards (and infos) for the agents' last actions, summed until the next step
        ("remote", an episode open here: checked now, sent with its next call)."""
        if self._local is not None:
            values = self._local.values
            self._local.env.log_returns(episode_id, values.rewards(rewards), values.infos(infos))
            return
        if isinstance(episode_id, str) and episode_id in self._queued:
            from marl_runner.serving.validation import add_rewards

            values = self._server_checks()
            rewards, infos = values.rewards(rewards), copy.deepcopy(values.infos(infos))
            with self._lock:
                queued = self._queued.get(episode_id)
                if queued is not None:  # else ended meanwhile by another thread: sent below
                    queued[1] = add_rewards(queued[1], rewards, f"log_returns({episode_id!r})")
                    queued[0].append([rewards, infos])
                    return
        self._transport.post("log_returns", {"episode_id": episode_id, "rewards": rewards, "infos": infos})

    def end_episode(self, episode_id: str, obs: dict, truncated: bool = False) -> None:
        """Ends the episode with its final obs; `truncated=True` for a time limit ("local":
        uploaded in the background; `close()` waits until it is)."""
        if self._local is not None:
            obs = self._local.values.obs(obs, allow_empty=True)
            self._local.env.end_episode(episode_id, obs, truncated)
            return
        self._step("end_episode", {"episode_id": episode_id, "obs": obs, "truncated": truncated},
                   ends=True)

    def health(self) -> dict:
        """The server's `GET /v1/health`: `{"ok": true, "running_episodes": N, "process": PID}`."""
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
        """Closes connections, after uploading every episode ended so far ("local": those still
        running are never uploaded) or sending the rewards still queued ("remote"). Raises the
        first error (after a `ValueError` the other queued rewards are still sent)."""
        if self._local is not None:
            self._local.close()
            self._transport.close()
            return
        with self._lock:
            queued = [(eid, pair) for eid, (pairs, _) in self._queued.items() for pair in pairs]
            self._queued = {eid: [[], {}] for eid in self._queued}
        error: BaseException | None = None
        try:
            for episode_id, (rewards, infos) in queued:
                if error is not None and not isinstance(error, ValueError):
                    break
                try:
                    self._transport.post(
                        "log_returns", {"episode_id": episode_id, "rewards": rewards, "infos": infos})
                except Exception as exc:
                    error = error or exc
        finally:
            self._transport.close()
        if error is not None:
            raise error

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _step(self, name: str, body: dict, *, ends: bool = False) -> Any:
        """`name`'s request, carrying the returns queued for its episode. `ends`: the episode
        is closed here (a `log_returns` meanwhile goes to the server), reopened if refused."""
        episode_id = body["episode_id"]
        with self._lock:
            queued = self._queued.pop(episode_id, None) if isinstance(episode_id, str) else None
            if queued is not None and not ends:
                self._queued[episode_id] = [[], {}]
        if queued and queued[0]:
            body["returns"] = queued[0]
        try:
            answer = self._transport.post(name, body)
        except BaseException as exc:
            # Put back only when the server did nothing: it refused the request (an answer
            # other than 200), or the request was never sent. Otherwise it may have applied
            # them (and ended the episode): never twice.
            did_nothing = isinstance(exc, Exception) and not (
                isinstance(exc, PolicyServerUnavailable) and exc.sent)
            if queued is not None and did_nothing:
                self._put_back(episode_id, queued[0], reopen=ends)
            raise
        if not ends:
            self._open(episode_id)
        return answer

    def _open(self, episode_id: str) -> None:
        """Keeps a queue for the episode; past `MAX_OPEN_EPISODES`, the oldest idle one goes."""
        with self._lock:
            if episode_id in self._queued:
                return
            if len(self._queued) >= MAX_OPEN_EPISODES:
                idle = next((eid for eid, (pairs, _) in self._queued.items() if not pairs), None)
                self._queued.pop(idle, None)
            self._queued[episode_id] = [[], {}]

    def _put_back(self, episode_id: str, pairs: list, *, reopen: bool) -> None:
        """A refused call's pairs, ahead of those logged since (`reopen`: it was to end the episode)."""
        with self._lock:
            if not reopen and episode_id not in self._queued:
                return  # ended meanwhile by another thread
            pairs = pairs + self._queued.get(episode_id, [[], {}])[0]
            sums: dict = {}
            for rewards, _ in pairs:
                for agent, reward in rewards.items():
                    sums[agent] = sums.get(agent, 0.0) + reward
            self._queued[episode_id] = [pairs, sums]

    def _server_checks(self) -> Any:
        """`validation.CallValues` on the server's agents and spaces, fetched at the first call."""
        if self._values is None:
            with self._values_lock:
                if self._values is None:
                    from marl_runner.serving.validation import checks_of_info

                    self._values = checks_of_info(self._transport.get("info"))
        return self._values
