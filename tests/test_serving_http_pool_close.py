"""`PooledHTTPServer.server_close` closes every connection it accepted, handed to a worker or not.

A connection accepted just as closing began sits in the hand-over queue to
the parking thread; the parking thread then ends without taking it, and
nothing closed it (the client hung until the socket was garbage-collected).
"""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler

from marl_runner.serving.http_pool import PooledHTTPServer


def test_a_connection_accepted_as_closing_began_is_closed():
    server = PooledHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, max_workers=1)
    client = socket.create_connection(server.server_address[:2], timeout=10)
    accepted, address = server.socket.accept()
    try:
        server._closing.set()  # as server_close begins; the parking thread is ending
        server._parker.join(10)
        server.process_request(accepted, address)  # the accept loop's last connection
        server.server_close()
        assert accepted.fileno() == -1
        assert client.recv(1) == b""  # the client sees the connection end
    finally:
        client.close()
        accepted.close()
