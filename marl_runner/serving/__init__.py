"""Serving policies over HTTP to external simulators: server, codec, request checks, CLI."""
