"""`PolicyServer`: an EnvRunner with `vectorize: external` behind an HTTP endpoint.

Standard library only (`http.server`, HTTP/1.1 keep-alive). Each request is
one of the five external-env calls, or, for clients that run the policies
themselves (`inference_mode="local"`), a download of the spaces/config and
of the current weights and connector state, or an upload of experience
batches. Bodies use `codec` (never pickle); every value is checked
(`validation`, `batches`) before it reaches the env, so a bad request costs
a 4xx, never the server.

Capacity is bounded (`http_pool`): connections are served by a fixed pool of
worker threads (more wait in a 256-deep listen backlog), one client address
holds at most `max_connections_per_client` of them (`client_connections`), idle keep-alive
connections close after a few seconds, a request must arrive within a
deadline however slowly it drips in (408 otherwise), and request bodies in flight share a
memory budget (a request that finds none within `BODY_WAIT_S` gets 503 with
`Retry-After`).

Closing loses nothing that was answered 200: `close()` stops accepting,
answers any new request 503, waits for the requests in progress, and only
then lets the caller drain the uploads; an upload that outlives that wait is
refused, never queued after the drain.

This module holds the server's lifecycle and its API calls; the HTTP side
(refusals, bodies, statuses) is `http_handler`, the weight exchange with
local-inference clients is `state_sync`.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from marl_runner.config import space_to_spec
from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.envs.external_vector_env import ExternalVectorEnv
from marl_runner.serving.batches import batch_from_value
from marl_runner.serving.body_memory import BodyBudget
from marl_runner.serving.client_connections import MAX_CONNECTIONS_PER_CLIENT, ClientConnections
from marl_runner.serving.http_deadlines import MIN_BODY_RATE, REQUEST_TIMEOUT_S
from marl_runner.serving.http_handler import (
    API_PREFIX,
    STOPPING_MESSAGE,
    HTTPStatusError,
    PolicyHTTPServer,
    PolicyRequestHandler,
)
from marl_runner.serving.state_sync import StateSync
from marl_runner.serving.validation import (
    RequestError,
    agent_values,
    episode_id_of,
    filter_deltas_of,
    infos_of,
    rewards_of,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A keep-alive connection with no request for this long is closed, so that idle
# clients do not hold the pool's workers; `PolicyClient` reconnects by itself.
IDLE_CONNECTION_TIMEOUT_S = 5.0
# Worker threads serving connections: at least this many, and enough for every episode
# slot to have a caller waiting in start_episode/get_action with room to spare.
MIN_WORKERS = 64
# How long a request waits for room in the memory budget before a 503.
BODY_WAIT_S = 30.0
# How long `close()` waits for the requests in progress to be answered.
CLOSE_WAIT_S = 10.0


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


class PolicyServer:
    """Serves `runner` (built with `vectorize: external`) on `host:port`.

    `start()` opens the HTTP endpoint in a background thread; `serve(stop,
    on_output)` runs the sampling loop in the calling thread until `stop` is
    set, handing every built batch, every batch uploaded by a local-inference
    client, and every episode's `RolloutMetrics` to `on_output`. `close()`
    stops the endpoint once the requests in progress are answered; then
    `drain_uploads` hands over every upload that was answered 200.
    `runner.stop()` unblocks clients still waiting.

    Binding anything but a loopback address needs `token`: clients then send
    `Authorization: Bearer <token>` or get 401. A token on loopback is
    enforced too.

    `max_workers` threads serve connections (default: `MIN_WORKERS`, or
    2 * num_envs + 16 when that is more, so every episode slot can have a
    waiting caller). `max_bytes_in_flight` bounds the estimated memory of the
    bodies in flight, reserved as they arrive (`body_memory`; default:
    4 * `max_body_bytes`, at least 256 MB). A keep-alive connection without a request for `idle_timeout_s`
    is closed, freeing its worker. A request's line and headers must arrive
    within `request_timeout_s` of its first byte, and its body (and each
    answer) must keep `min_body_rate` bytes/s after a `request_timeout_s`
    head start, else 408 and the connection ends: slow clients cannot hold
    the workers. One client address holds at most `max_connections_per_client`
    connections open (default: `MAX_CONNECTIONS_PER_CLIENT`, or num_envs + 16
    when that is more, so one simulator host can run every episode slot at
    once); one more gets 503 with `Retry-After` at once (drained briefly before
    it closes, so a client mid-upload reads it: `http_linger`), counted in
    `client_connections.refused`: one host cannot take every connection.
    """

    def __init__(
        self,
        runner: Any,
        host: str = "127.0.0.1",
        port: int = 9900,
        *,
        token: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_workers: int | None = None,
        max_bytes_in_flight: int | None = None,
        idle_timeout_s: float = IDLE_CONNECTION_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        min_body_rate: float = MIN_BODY_RATE,
        max_connections_per_client: int | None = None,
    ) -> None:
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
        self.token = token or None
        self.max_body_bytes = max_body_bytes
        self.state_sync = StateSync()
        self.uploads: queue.SimpleQueue = queue.SimpleQueue()
        self.num_uploaded = 0
        if max_workers is None:
            max_workers = max(MIN_WORKERS, 2 * runner.env.num_envs + 16)
        if max_connections_per_client is None:
            max_connections_per_client = max(MAX_CONNECTIONS_PER_CLIENT, runner.env.num_envs + 16)
        if max_bytes_in_flight is None:
            max_bytes_in_flight = max(4 * max_body_bytes, 256 * 1024 * 1024)
        self.body_budget = BodyBudget(max_bytes_in_flight)
        self.body_wait_s = BODY_WAIT_S  # read by the handler before a 503 for lack of memory
        self._httpd = PolicyHTTPServer(
            (host, port), PolicyRequestHandler, max_workers, idle_timeout_s,
            request_timeout_s=request_timeout_s, min_body_rate=min_body_rate,
            max_connections_per_client=max_connections_per_client,
        )
        self._httpd.policy_server = self
        self._thread: threading.Thread | None = None
        # Requests in progress, and whether close() began / uploads may still be queued.
        self._requests = threading.Condition()
        self._in_progress = 0
        self._closing = False
        self._uploads_open = True

    @property
    def closing(self) -> bool:
        """Whether `close()` has begun: every request from then on is answered 503."""
        return self._closing

    @property
    def requests_timed_out(self) -> int:
        """Requests, or answers left unread, that missed their deadline (408 where possible)."""
        return self._httpd.requests_timed_out

    @property
    def client_connections(self) -> ClientConnections:
        """Open connections per client address, and how many the cap refused (`refused`)."""
        return self._httpd.client_connections

    @property
    def address(self) -> str:
        """`http://HOST:PORT` as bound, for clients."""
        host, port = self.server_address_tuple()
        return f"http://{host}:{port}"

    def server_address_tuple(self) -> tuple[str, int]:
        """`(host, port)` actually bound (port 0 asks the OS for a free one)."""
        host, port = self._httpd.server_address[:2]
        return host, port

    def start(self) -> PolicyServer:
        """Serves HTTP requests from a background thread; returns `self`."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
            name="marl-runner-http", daemon=True,
        )
        self._thread.start()
        return self

    def serve(self, stop: threading.Event, on_output: Callable[[Any], None]) -> None:
        """The sampling loop: runner steps, uploaded batches, weight snapshots, until `stop`."""
        runner = self.runner
        while not stop.is_set():
            for item in runner.step():
                on_output(item)
            self.drain_uploads(on_output)
            self.state_sync.refresh(runner)

    def drain_uploads(self, on_output: Callable[[Any], None]) -> None:
        """Hands the batches uploaded since the last call to `on_output`, in the caller's thread.

        Uploads are checked in the request's thread but written by the
        sampling loop, so one writer owns `--out`.
        """
        while True:
            try:
                batch = self.uploads.get_nowait()
            except queue.Empty:
                return
            self.num_uploaded += 1
            on_output(batch)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stops the endpoint without losing an answered request.

        New connections are no longer accepted and any new request, on a
        connection already open too, gets 503 with `Connection: close`. The
        requests in progress get up to `timeout_s` to be answered; uploads
        still running after that are refused (503), so that `drain_uploads()`
        called after `close()` sees every upload that was answered 200.
        Weight syncs still waiting get 503: no sampling loop will answer them.
        """
        with self._requests:
            self._closing = True
        self.state_sync.stop(STOPPING_MESSAGE)
        if self._thread is not None:
            self._httpd.shutdown()  # the accept loop ends
        with self._requests:
            finished = self._requests.wait_for(lambda: self._in_progress == 0, timeout_s)
            self._uploads_open = False
            if not finished:
                logger.warning(
                    "closing with %d request(s) still in progress after %.1f s; uploads among "
                    "them are refused (503)", self._in_progress, timeout_s,
                )
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def begin_request(self) -> bool:
        """Counts a request in progress, so `close()` can wait for it; False once `close()` began.

        The HTTP handler calls it before anything else and answers 503 on False.
        """
        with self._requests:
            if self._closing:
                return False
            self._in_progress += 1
            return True

    def end_request(self) -> None:
        """Ends what `begin_request` counted; `close()` may be waiting for the count to reach 0."""
        with self._requests:
            self._in_progress -= 1
            self._requests.notify_all()

    # ------------------------------------------------------------------ the API

    def call(self, method: str, name: str, body: Any) -> Any:
        """Runs one API call; returns the response value (`bytes` when already encoded)."""
        handler = self.route(method, name)
        if method == "POST" and not isinstance(body, dict):
            raise RequestError(f"the body must be an object, got {type(body).__name__}")
        return handler(self, body)

    def route(self, method: str, name: str) -> Callable[[PolicyServer, Any], Any]:
        """The API call `method /v1/name` runs; `HTTPStatusError` (404, 405) when there is none.

        The HTTP handler asks before reading a body, so that a request for no
        endpoint is never invited to send one.
        """
        routes = _GET_ROUTES if method == "GET" else _POST_ROUTES
        handler = routes.get(name)
        if handler is None:
            other = _POST_ROUTES if method == "GET" else _GET_ROUTES
            if name in other:
                raise HTTPStatusError(
                    HTTPStatus.METHOD_NOT_ALLOWED, f"{API_PREFIX}{name} does not take {method}"
                )
            raise HTTPStatusError(HTTPStatus.NOT_FOUND, f"no endpoint {API_PREFIX}{name}; "
                                  f"endpoints: {sorted(_GET_ROUTES) + sorted(_POST_ROUTES)}")
        return handler

    def _start_episode(self, body: dict) -> dict:
        training_enabled = body.get("training_enabled", True)
        if not isinstance(training_enabled, bool):
            raise RequestError(f"training_enabled: {training_enabled!r} is not true/false")
        episode_id = episode_id_of(body, required=False)
        return {"episode_id": self.env.start_episode(episode_id, training_enabled)}

    def _get_action(self, body: dict) -> dict:
        episode_id = episode_id_of(body)
        obs = self._observations(body)
        return {"actions": self.env.get_action(episode_id, obs)}

    def _log_action(self, body: dict) -> dict:
        episode_id = episode_id_of(body)
        obs = self._observations(body)
        actions = agent_values(body, "actions", self.env.get_action_space)
        self.env.log_action(episode_id, obs, actions)
        return {}

    def _log_returns(self, body: dict) -> dict:
        episode_id = episode_id_of(body)
        rewards = rewards_of(body, self.env.get_observation_space)
        infos = infos_of(body, self.env.get_action_space)
        self.env.log_returns(episode_id, rewards, infos)
        return {}

    def _end_episode(self, body: dict) -> dict:
        episode_id = episode_id_of(body)
        obs = self._observations(body, allow_empty=True)
        truncated = body.get("truncated", False)
        if not isinstance(truncated, bool):
            raise RequestError(f"truncated: {truncated!r} is not true/false")
        self.env.end_episode(episode_id, obs, truncated)
        return {}

    def _experiences(self, body: dict) -> dict:
        batch = batch_from_value(body, self.runner.policy_map)
        with self._requests:  # queued before close() stops waiting, or refused
            if not self._uploads_open:
                raise ExternalEnvStopped(f"{STOPPING_MESSAGE} (the upload was not written)")
            self.uploads.put(batch)
        return {}

    def _observations(self, body: dict, *, allow_empty: bool = False) -> dict:
        return agent_values(
            body, "obs", self.env.get_observation_space, allow_empty=allow_empty,
            action_space_of=self.env.get_action_space,
        )

    def _info(self, body: Any) -> dict:
        agents = list(self.env.possible_agents)
        obs_space, action_space = self.env.get_observation_space, self.env.get_action_space
        return {
            "config": self.runner.config.to_dict(),
            "observation_spaces": {a: space_to_spec(obs_space(a)) for a in agents},
            "action_spaces": {a: space_to_spec(action_space(a)) for a in agents},
        }

    def _state(self, body: dict) -> bytes:
        return self.state_sync.exchange(filter_deltas_of(body, self.runner.policy_map))

    def _health(self, body: Any) -> dict:
        return {"ok": True, "running_episodes": self.runner.env.board.num_running}


_POST_ROUTES: dict[str, Callable[[PolicyServer, Any], Any]] = {
    "start_episode": PolicyServer._start_episode,
    "get_action": PolicyServer._get_action,
    "log_action": PolicyServer._log_action,
    "log_returns": PolicyServer._log_returns,
    "end_episode": PolicyServer._end_episode,
    "experiences": PolicyServer._experiences,
    "state": PolicyServer._state,
}
_GET_ROUTES: dict[str, Callable[[PolicyServer, Any], Any]] = {
    "info": PolicyServer._info,
    "health": PolicyServer._health,
}
