"""`PolicyServer`: an EnvRunner with `vectorize: external` behind the HTTP API.

Every value is checked (`validation`, `batches`) before it reaches the env,
so a bad request costs a 4xx, never the server. A `get_action` waits on the
event loop, not in a thread, and the runner's poll takes every request queued
into one forward pass, in the sampling loop's thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from marl_runner.config import space_to_spec
from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.envs.external_vector_env import ExternalVectorEnv
from marl_runner.serving.batches import batch_from_value
from marl_runner.serving.http_app import STOPPING_MESSAGE, HttpEndpoint, HttpSettings
from marl_runner.serving.state_sync import StateSync
from marl_runner.serving.validation import (
    CallValues,
    RequestError,
    episode_id_of,
    filter_deltas_of,
)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# Requests handled at once: at least this many, and enough for every episode slot to
# have a caller waiting in start_episode/get_action with room to spare.
MIN_CONCURRENCY = 64


class ServerSetupError(ValueError):
    """The server cannot start as asked (e.g. a public address without a token)."""


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts local connections (no token needed there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket listening on `host:port` (port 0: a free one); `reuse_port`: other
    processes may listen on it too (`SO_REUSEPORT`: the kernel spreads new connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, reuse_port=reuse_port)


class PolicyServer(HttpEndpoint):
    """Serves `runner` (built with `vectorize: external`) on `host:port`.

    `start()` opens the endpoint; `serve(stop, on_output)` runs the sampling
    loop in the calling thread, handing every built or uploaded batch and
    every episode's `RolloutMetrics` to `on_output`; `close()` stops the
    endpoint, after which `drain_uploads` hands over every upload answered 200.

    A non-loopback `host` needs `token` (clients send `Authorization: Bearer
    <token>`); a token on loopback is enforced too. `max_concurrency`
    defaults to enough for every episode slot to have a waiting caller; the
    other settings are `HttpSettings`'. `sock`: a socket already bound (shared
    by worker processes). `local_only`: remote-inference calls get 501;
    `upstream`: a worker's link to the main process (see `workers`).
    """

    def __init__(self, runner: Any, host: str = "127.0.0.1", port: int = 9900, *,
                 token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_concurrency: int | None = None, sock: socket.socket | None = None,
                 local_only: bool = False, upstream: Any = None, **settings: Any) -> None:
        if not isinstance(runner.env, ExternalVectorEnv):
            raise ServerSetupError(
                f"PolicyServer needs a runner with `vectorize: external`, got vectorize "
                f"{runner.config.vectorize!r}"
            )
        if not token and not is_loopback(host):
            raise ServerSetupError(
                f"binding {host!r} (not a loopback address) needs a shared token: pass --token "
                "or set MARL_RUNNER_TOKEN, and give the same token to the clients"
            )
        self.runner = runner
        self.env = runner.env.env
        self.board = runner.env.board
        self.values = CallValues(self.env)
        self.state_sync = StateSync()
        self.uploads: queue.SimpleQueue = queue.SimpleQueue()
        self.num_uploaded = 0
        if max_concurrency is None:
            max_concurrency = max(MIN_CONCURRENCY, 2 * runner.env.num_envs + 16)
        self.upstream = upstream
        routes = {("POST", name): getattr(self, f"_{name}") for name in POST_CALLS}
        if local_only:
            routes.update({("POST", name): self._remote_refused for name in REMOTE_CALLS})
        routes.update({("GET", name): getattr(self, f"_{name}") for name in GET_CALLS})
        sock = sock if sock is not None else listening_socket(host, port)
        self._bound: tuple[str, int] = sock.getsockname()[:2]
        settings = HttpSettings(max_body_bytes, max_concurrency, **settings)
        super().__init__(routes, settings, token or None, sock)
        self._handoff = Handoff(self.loop)
        self._uploads_lock = threading.Lock()
        self._uploads_open = True

    @property
    def address(self) -> str:
        """`http://HOST:PORT` as bound, for clients."""
        host, port = self.server_address_tuple()
        return f"http://{host}:{port}"

    def server_address_tuple(self) -> tuple[str, int]:
        """`(host, port)` actually bound (port 0 asks the OS for a free one)."""
        return self._bound

    def serve(self, stop: threading.Event, on_output: Callable[[Any], None]) -> None:
        """The sampling loop: runner steps, uploaded batches, weight snapshots, until `stop`."""
        runner = self.runner
        while not stop.is_set():
            for item in runner.step():
                on_output(item)
            self.drain_uploads(on_output)
            self.state_sync.refresh(runner)

    def drain_uploads(self, on_output: Callable[[Any], None]) -> None:
        """Hands the batches uploaded since the last call to `on_output`, in the caller's
        thread: the sampling loop's, so one writer owns `--out`."""
        while True:
            try:
                batch = self.uploads.get_nowait()
            except queue.Empty:
                return
            self.num_uploaded += 1
            on_output(batch)

    def close(self, timeout_s: float | None = None) -> None:
        """Stops the endpoint without losing an answered request: new requests get 503, those
        in progress get up to `timeout_s` (default `close_wait_s`); uploads still running then
        are refused, so `drain_uploads()` after this sees every upload answered 200. Weight
        syncs still waiting get 503: no sampling loop will answer them."""
        self.state_sync.stop(STOPPING_MESSAGE)
        self.stop_serving(self._close_uploads, timeout_s)

    def _close_uploads(self) -> None:
        with self._uploads_lock:
            self._uploads_open = False

    # ------------------------------------------------------------------ the API

    async def _start_episode(self, body: dict) -> dict:
        training_enabled = _object(body).get("training_enabled", True)
        if not isinstance(training_enabled, bool):
            raise RequestError(f"training_enabled: {training_enabled!r} is not true/false")
        episode_id = episode_id_of(body, required=False)
        # Waits for a free slot: in a thread, so the event loop goes on meanwhile.
        return {"episode_id": await asyncio.to_thread(
            self.board.start_episode, episode_id, training_enabled)}

    # get_action, log_action and end_episode may carry `returns` (logged since the last step).
    # All values are checked, then the returns applied as one `log_returns` (which refuses an
    # unknown episode before changing anything), then the call: a refused request changes nothing.

    async def _get_action(self, body: dict) -> dict:
        episode_id = episode_id_of(_object(body))
        obs = self.values.obs(body.get("obs"))
        self._log_returns_of(episode_id, self.values.returns(body.get("returns")))
        answer = self.loop.create_future()
        self.board.request_action(episode_id, obs, functools.partial(self._handoff.settle, answer))
        return {"actions": await answer}

    async def _log_action(self, body: dict) -> dict:
        episode_id = episode_id_of(_object(body))
        obs = self.values.obs(body.get("obs"))
        actions = self.values.actions(body.get("actions"))
        extra = [agent for agent in actions if agent not in obs]
        if extra:
            raise RequestError(f"actions: agents {extra} have no obs in this step; agents with "
                               f"an obs: {list(obs)}")
        self._log_returns_of(episode_id, self.values.returns(body.get("returns")))
        self.board.log_action(episode_id, obs, actions)
        return {}

    async def _log_returns(self, body: dict) -> dict:
        episode_id = episode_id_of(_object(body))
        rewards = self.values.rewards(body.get("rewards"))
        infos = self.values.infos(body.get("infos"))
        self.board.log_returns(episode_id, rewards, infos)
        return {}

    async def _end_episode(self, body: dict) -> dict:
        episode_id = episode_id_of(_object(body))
        obs = self.values.obs(body.get("obs"), allow_empty=True)
        truncated = body.get("truncated", False)
        if not isinstance(truncated, bool):
            raise RequestError(f"truncated: {truncated!r} is not true/false")
        self._log_returns_of(episode_id, self.values.returns(body.get("returns")))
        self.board.end_episode(episode_id, obs, truncated)
        return {}

    def _log_returns_of(self, episode_id: str, returns: tuple[dict, dict] | None) -> None:
        if returns is not None:
            self.board.log_returns(episode_id, *returns)

    async def _experiences(self, body: dict) -> dict:
        # Checking a big upload takes a while: in a thread, so the event loop goes on.
        batch = await asyncio.to_thread(batch_from_value, _object(body), self.runner.policy_map)
        if self.upstream is not None:
            return await asyncio.to_thread(self.upstream.call, "experiences", batch)
        return self.accept_upload(batch)

    def accept_upload(self, batch: Any) -> dict:
        """Queues a checked upload for `drain_uploads`, or refuses it once closing stopped
        waiting (so nothing answered 200 is left behind)."""
        with self._uploads_lock:
            if not self._uploads_open:
                raise ExternalEnvStopped(f"{STOPPING_MESSAGE} (the upload was not written)")
            self.uploads.put(batch)
        return {}

    async def _remote_refused(self, body: Any) -> dict:
        raise NotImplementedError(
            "this server runs several processes for local inference (serve --workers N): "
            "use PolicyClient(inference_mode='local'), or serve remote inference with --workers 1"
        )

    async def _info(self, body: None) -> dict:
        agents = list(self.env.possible_agents)
        obs_space, action_space = self.env.get_observation_space, self.env.get_action_space
        return {
            "config": self.runner.config.to_dict(),
            "observation_spaces": {a: space_to_spec(obs_space(a)) for a in agents},
            "action_spaces": {a: space_to_spec(action_space(a)) for a in agents},
        }

    async def _state(self, body: dict) -> bytes:
        deltas = filter_deltas_of(_object(body), self.runner.policy_map)
        # Waits for the sampling loop to merge and snapshot between two steps.
        if self.upstream is not None:
            return await asyncio.to_thread(self.upstream.call, "state", deltas)
        return await asyncio.to_thread(self.state_sync.exchange, deltas)

    async def _health(self, body: None) -> dict:
        return {"ok": True, "running_episodes": self.board.num_running, "process": os.getpid()}


class Handoff:
    """Settles futures of `loop` from other threads, waking the loop once per burst: a forward
    pass's answers come one after the other, and a `call_soon_threadsafe` each would write
    to the loop's self-pipe once per answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: collections.deque = collections.deque()
        self._scheduled = False

    def settle(self, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
        """From any thread: `future` gets `result`, or raises `error` when it is not None."""
        # Queued before the flag is read: a flag still set stands for a `_settle_all` that
        # has yet to clear it and only then empties the queue, this answer included.
        self._queue.append((future, result, error))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon_threadsafe(self._settle_all)

    def _settle_all(self) -> None:
        self._scheduled = False
        while self._queue:
            future, result, error = self._queue.popleft()
            if future.done():  # cancelled: its request ended (the client went away)
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


REMOTE_CALLS = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")
POST_CALLS = (*REMOTE_CALLS, "experiences", "state")
GET_CALLS = ("info", "health")


def _object(body: Any) -> dict:
    """A POST body must be an object (a JSON client may send anything)."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be an object, got {type(body).__name__}")
    return body
