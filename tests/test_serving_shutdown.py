"""Stopping the endpoint leaves no task of its event loop pending.

aiohttp forgets a connection's handler task once its client has gone, so its
graceful shutdown never ends one that is still running: a call whose client
left mid-request, or a refused request whose unsent body is being drained.
Closed with the loop, such a task is "destroyed but pending" (asyncio's error
when it is collected) and its `finally` blocks never run.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
from typing import Any

import pytest

from marl_runner.serving.http_app import HttpEndpoint, HttpSettings
from tests.test_serving_http import wait_for

CALL = b"POST /v1/call HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
# Refused (no token): its declared body never comes, so aiohttp waits to drain it.
UNAUTHORIZED = b"POST /v1/call HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"


@pytest.mark.parametrize("request_bytes", [CALL + b"Authorization: Bearer secret\r\n\r\n{}",
                                           UNAUTHORIZED], ids=["call-running", "body-draining"])
def test_a_handler_whose_client_left_is_ended_before_the_loop_closes(request_bytes: bytes) -> None:
    entered, ended = threading.Event(), threading.Event()

    async def never_answers(body: Any) -> None:
        entered.set()
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            ended.set()

    settings = HttpSettings(max_body_bytes=1024, max_concurrency=4, close_wait_s=0.2)
    endpoint = HttpEndpoint({("POST", "call"): never_answers}, settings, "secret",
                            socket.create_server(("127.0.0.1", 0))).start()
    reported: list[str] = []
    endpoint.loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))
    with socket.create_connection(endpoint.sock.getsockname()[:2], timeout=5) as client:
        client.sendall(request_bytes)
        if request_bytes is UNAUTHORIZED:
            assert client.recv(4096).startswith(b"HTTP/1.1 401")
        else:
            assert entered.wait(5)
    assert endpoint._web_runner is not None
    server = endpoint._web_runner.server
    assert server is not None
    wait_for(lambda: all(handler.transport is None for handler in server.connections), 5)
    endpoint.stop_serving(lambda: None, wait_s=0)
    assert endpoint._thread is not None
    endpoint._thread.join(5)
    assert not endpoint._thread.is_alive()
    assert not asyncio.all_tasks(endpoint.loop), "tasks left pending on the closed loop"
    gc.collect()  # a task destroyed pending is reported when it is collected
    assert reported == []
    assert ended.is_set() == entered.is_set(), "the call's `finally` never ran"
