"""`PolicyServer`: an EnvRunner with `vectorize: external` behind an HTTP endpoint.

Standard library only (`http.server`, HTTP/1.1 keep-alive). Each request is
one of the five external-env calls, or, for clients that run the policies
themselves (`inference_mode="local"`), a download of the spaces/config and
of the current weights and connector state, or an upload of experience
batches. Bodies use `codec` (never pickle); every value is checked
(`validation`, `batches`) before it reaches the env, so a bad request costs
a 4xx, never the server.

Capacity is bounded (`http_pool`): connections are served by a fixed pool of
worker threads (more wait in a 256-deep listen backlog), idle keep-alive
connections close after a few seconds, and request bodies in flight share a
memory budget (a request that finds none within `BODY_WAIT_S` gets 503 with
`Retry-After`).

Closing loses nothing that was answered 200: `close()` stops accepting,
answers any new request 503, waits for the requests in progress, and only
then lets the caller drain the uploads; an upload that outlives that wait is
refused, never queued after the drain.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import queue
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from marl_runner.config import space_to_spec
from marl_runner.distributed.filter_states import (
    install_filter_states,
    merge_filter_states,
    read_filter_states,
)
from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.envs.external_vector_env import ExternalVectorEnv
from marl_runner.serving import codec
from marl_runner.serving.batches import batch_from_value
from marl_runner.serving.http_pool import BodyBudget, PooledHTTPServer, release_free_memory
from marl_runner.serving.validation import (
    RequestError,
    agent_values,
    episode_id_of,
    filter_deltas_of,
    infos_of,
    rewards_of,
)

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A keep-alive connection with no request for this long is closed, so that idle
# clients do not hold the pool's workers; `PolicyClient` reconnects by itself.
IDLE_CONNECTION_TIMEOUT_S = 5.0
# Worker threads serving connections: at least this many, and enough for every episode
# slot to have a caller waiting in start_episode/get_action with room to spare.
MIN_WORKERS = 64
# Estimated peak memory per body byte while a request is decoded and checked (JSON
# numbers become Python objects; binary arrays are copied out of the body once).
JSON_MEMORY_FACTOR = 6
BINARY_MEMORY_FACTOR = 2
# After a body this big, freed memory goes back to the OS (see `release_free_memory`).
TRIM_AFTER_BYTES = 8 * 1024 * 1024
# How long a request waits for room in the memory budget before a 503.
BODY_WAIT_S = 30.0
# How long `close()` waits for the requests in progress to be answered.
CLOSE_WAIT_S = 10.0
STOPPING_MESSAGE = "the server is stopping; this request was not run"


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


class _SyncRequest:
    __slots__ = ("deltas", "body", "error")

    def __init__(self, deltas: dict) -> None:
        self.deltas = deltas
        self.body: bytes | None = None
        self.error: BaseException | None = None


class StateSync:
    """Weights and connector state for local-inference clients, exchanged in the runner's thread.

    A client sends what its observation filters saw since its last sync
    (their deltas) and gets back the server's weights and connector state,
    with those deltas merged in exactly (as `EnvRunnerGroup` does for its
    runners). The sampling loop does the merge and the snapshot between two
    steps (`refresh`), so nobody touches the policies while the runner uses them.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pending: list[_SyncRequest] = []
        self._stopped: ExternalEnvStopped | None = None

    def exchange(self, deltas: dict, timeout_s: float = 30.0) -> bytes:
        """Queues a client's filter deltas; returns the encoded state once the runner merged them."""
        request = _SyncRequest(deltas)
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._pending.append(request)
            done = self._lock.wait_for(lambda: request.body is not None or request.error, timeout_s)
        if request.error is not None:
            raise request.error
        if not done:
            raise TimeoutError("the runner did not publish its weights in time")
        assert request.body is not None
        return request.body

    def refresh(self, runner: Any) -> None:
        """Merges the queued deltas and publishes one state snapshot; the sampling loop calls it."""
        with self._lock:
            if not self._pending:
                return
            requests, self._pending = self._pending, []
        for request in requests:
            if request.deltas:
                try:
                    merged = merge_filter_states(read_filter_states(runner), [request.deltas])
                    install_filter_states(runner, merged)
                except Exception as exc:
                    request.error = RequestError(f"filter_deltas do not fit the server's filters: {exc}")
        body = codec.encode(runner.get_state())
        with self._lock:
            for request in requests:
                request.body = body
            self._lock.notify_all()

    def stop(self, reason: str) -> None:
        """Fails the queued and later exchanges: no sampling loop will answer them any more."""
        with self._lock:
            self._stopped = ExternalEnvStopped(reason)
            for request in self._pending:
                request.error = self._stopped
            self._pending = []
            self._lock.notify_all()


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
    bodies being decoded at once (default: 4 * `max_body_bytes`, at least
    256 MB). A keep-alive connection without a request for `idle_timeout_s`
    is closed, freeing its worker.
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
        if max_bytes_in_flight is None:
            max_bytes_in_flight = max(4 * max_body_bytes, 256 * 1024 * 1024)
        self.body_budget = BodyBudget(max_bytes_in_flight)
        self._httpd = _HTTPServer((host, port), _Handler, max_workers, idle_timeout_s)
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

    def _begin_request(self) -> bool:
        """Counts a request in progress; False once `close()` began (answer 503 instead)."""
        with self._requests:
            if self._closing:
                return False
            self._in_progress += 1
            return True

    def _end_request(self) -> None:
        with self._requests:
            self._in_progress -= 1
            self._requests.notify_all()

    # ------------------------------------------------------------------ the API

    def call(self, method: str, name: str, body: Any) -> Any:
        """Runs one API call; returns the response value (`bytes` when already encoded)."""
        routes = _GET_ROUTES if method == "GET" else _POST_ROUTES
        handler = routes.get(name)
        if handler is None:
            other = _POST_ROUTES if method == "GET" else _GET_ROUTES
            if name in other:
                raise _HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{API_PREFIX}{name} does not take {method}")
            raise _HTTPError(HTTPStatus.NOT_FOUND, f"no endpoint {API_PREFIX}{name}; endpoints: "
                             f"{sorted(_GET_ROUTES) + sorted(_POST_ROUTES)}")
        if method == "POST" and not isinstance(body, dict):
            raise RequestError(f"the body must be an object, got {type(body).__name__}")
        return handler(self, body)

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
        return {
            "config": self.runner.config.to_dict(),
            "observation_spaces": {a: space_to_spec(self.env.get_observation_space(a)) for a in agents},
            "action_spaces": {a: space_to_spec(self.env.get_action_space(a)) for a in agents},
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
# Exception types a client re-raises as themselves (anything else: PolicyServerError).
_STATUS_OF: tuple[tuple[type[BaseException], HTTPStatus], ...] = (
    (ExternalEnvStopped, HTTPStatus.SERVICE_UNAVAILABLE),
    (TimeoutError, HTTPStatus.SERVICE_UNAVAILABLE),
    (NotImplementedError, HTTPStatus.NOT_IMPLEMENTED),
    (MemoryError, HTTPStatus.SERVICE_UNAVAILABLE),
    (ValueError, HTTPStatus.BAD_REQUEST),  # RequestError, CodecError, unknown episodes
)


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _HTTPServer(PooledHTTPServer):
    policy_server: PolicyServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-request is routine for a server; log it quietly.
        logger.debug("connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small replies: no 40 ms wait for a delayed ACK
    server: _HTTPServer

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout_s  # socket timeout: idle keep-alive ends
        super().setup()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "use GET or POST", codec.JSON)

    do_DELETE = do_PATCH = do_PUT

    def _handle(self, method: str) -> None:
        server = self.server.policy_server
        content_type = self._content_type()
        if not server._begin_request():
            self._refuse_stopping(method, server.max_body_bytes, content_type)
            return
        try:
            self._handle_request(server, method, content_type)
        finally:
            server._end_request()

    def _handle_request(self, server: PolicyServer, method: str, content_type: str) -> None:
        """Checks the token, path, content type and size, reserves memory, then answers."""
        if server.token is not None and not self._authorized(server.token):
            self._refuse(HTTPStatus.UNAUTHORIZED, "missing or wrong token: send "
                         "'Authorization: Bearer <token>'", content_type)
            return
        if not self.path.startswith(API_PREFIX):
            self._refuse(HTTPStatus.NOT_FOUND, f"no endpoint {self.path!r}; the API lives under "
                         f"{API_PREFIX}", content_type)
            return
        if method == "POST":
            if self.headers.get("Content-Type", "").split(";")[0].strip() not in codec.CONTENT_TYPES:
                self._refuse(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be one of "
                             f"{list(codec.CONTENT_TYPES)}; nothing else is decoded", codec.JSON)
                return
            length = self._body_length(server.max_body_bytes, content_type)
            if length is None:
                return
            factor = JSON_MEMORY_FACTOR if content_type == codec.JSON else BINARY_MEMORY_FACTOR
            reserved = server.body_budget.reserve(length * factor, BODY_WAIT_S)
            if reserved is None:
                # Read and drop the body so the client, still sending it, gets to read the 503.
                if self._discard_body(length):
                    payload = codec.encode({"error": f"the server is decoding "
                                            f"{server.body_budget.in_flight} bytes' worth of other "
                                            "bodies; retry in a moment", "type": "HTTPError"},
                                           content_type)
                    self._send_bytes(HTTPStatus.SERVICE_UNAVAILABLE, payload, content_type,
                                     {"Retry-After": "1"})
                return
            try:
                self._answer(server, method, content_type, length)
            finally:
                server.body_budget.release(reserved)
                if length >= TRIM_AFTER_BYTES:
                    release_free_memory()
        else:
            self._answer(server, method, content_type, None)

    def _answer(self, server: PolicyServer, method: str, content_type: str, length: int | None) -> None:
        """Reads the body (if any), runs the call and sends its answer; errors become statuses."""
        body = None
        if length is not None:
            raw = self._read_body(length)
            if raw is None:
                return
        try:
            if length is not None:
                if content_type == codec.JSON:
                    raw = codec.json_text(raw)  # the bytes are freed before parsing
                body = codec.decode(raw, content_type)
                del raw
            result = server.call(method, self.path[len(API_PREFIX):].split("?")[0], body)
            del body
            payload = result if isinstance(result, bytes) else codec.encode(result, content_type)
            if isinstance(result, bytes):
                content_type = codec.BINARY
        except _HTTPError as exc:
            self._send(exc.status, {"error": str(exc), "type": "HTTPError"}, content_type)
            return
        except Exception as exc:
            status = next((s for t, s in _STATUS_OF if isinstance(exc, t)), None)
            if status is None:
                logger.exception("request %s %s failed", method, self.path)
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            self._send(status, {"error": str(exc), "type": type(exc).__name__}, content_type)
            return
        self._send_bytes(HTTPStatus.OK, payload, content_type)

    def _refuse_stopping(self, method: str, limit: int, content_type: str) -> None:
        """503 and `Connection: close` to a request that came after `close()` began.

        A body of a sane declared size is read and dropped first, so that the
        client, maybe still sending it, gets to read the answer.
        """
        self.close_connection = True
        length_text = self.headers.get("Content-Length", "")
        if method == "POST" and length_text.isdigit() and int(length_text) <= limit:
            self._discard_body(int(length_text))
        self._send(HTTPStatus.SERVICE_UNAVAILABLE,
                   {"error": STOPPING_MESSAGE, "type": "ExternalEnvStopped"}, content_type)

    def _content_type(self) -> str:
        declared = self.headers.get("Content-Type", "").split(";")[0].strip()
        accept = self.headers.get("Accept", "")
        if declared in codec.CONTENT_TYPES:
            return declared
        return codec.JSON if codec.JSON in accept or codec.BINARY not in accept else codec.BINARY

    def _authorized(self, token: str) -> bool:
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {token}"
        return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))

    def _body_length(self, limit: int, content_type: str) -> int | None:
        """The declared body length, or None after refusing a chunked, missing or oversized one."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send "
                         "Content-Length", content_type)
            return None
        length_text = self.headers.get("Content-Length")
        try:
            length = int(length_text) if length_text is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "a POST needs a valid Content-Length", content_type)
            return None
        if length > limit:
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"body of {length} bytes is over the server's limit of {limit} bytes",
                         content_type)
            return None
        return length

    def _read_body(self, length: int) -> bytearray | None:
        """`length` bytes read into one buffer (no second copy); None if the client went away."""
        raw = bytearray(length)
        view = memoryview(raw)
        received = 0
        try:
            while received < length:
                count = self.rfile.readinto(view[received:])
                if not count:
                    break
                received += count
        except (TimeoutError, OSError):
            received = -1
        finally:
            view.release()
        if received != length:
            self.close_connection = True  # the client went away mid-body
            return None
        return raw

    def _discard_body(self, length: int) -> bool:
        """Reads `length` body bytes into a small buffer, keeping none; False if the client left."""
        chunk = bytearray(min(length, 1 << 16)) or bytearray(1)
        left = length
        try:
            while left > 0:
                count = self.rfile.readinto(memoryview(chunk)[: min(left, len(chunk))])
                if not count:
                    break
                left -= count
        except (TimeoutError, OSError):
            pass
        if left:
            self.close_connection = True
        return not left

    def _refuse(
        self, status: HTTPStatus, message: str, content_type: str, headers: dict | None = None
    ) -> None:
        """An error answered before the body was read: the connection cannot be reused."""
        self.close_connection = True
        payload = codec.encode({"error": message, "type": "HTTPError"}, content_type)
        self._send_bytes(status, payload, content_type, headers)

    def _send(self, status: HTTPStatus, value: dict, content_type: str) -> None:
        self._send_bytes(status, codec.encode(value, content_type), content_type)

    def _send_bytes(
        self, status: HTTPStatus, payload: bytes, content_type: str, headers: dict | None = None
    ) -> None:
        if self.server.saturated:
            self.close_connection = True  # other connections wait for a worker: take turns
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client is gone; nothing to tell it

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)
