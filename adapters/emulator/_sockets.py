"""Loopback listening ports an outage can hold while it refuses connections."""

from __future__ import annotations

__all__ = ["bind_loopback"]

import socket


def bind_loopback(port: int) -> socket.socket:
    """A TCP socket bound to ``127.0.0.1:port`` (0: a free port), not listening.

    SO_REUSEPORT lets a second socket bind the same port while the first holds it: an
    outage binds the port's reservation before its listener closes, and ``restore`` binds
    the new listener before the reservation closes, so the port is never free for another
    process to take (an ephemeral client port of any test worker, which made ``restore``
    fail with "address already in use"). Bound and not listening, the port refuses
    connections, as a region that is down does.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock
