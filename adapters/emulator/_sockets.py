"""Loopback listening ports an outage can hold while it refuses connections."""

from __future__ import annotations

__all__ = ["bind_loopback"]

import errno
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
    if port and port not in _OURS:
        _check_free(port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    _OURS.add(sock.getsockname()[1])
    return sock


#: The ports this process bound: its own outages and restores bind them again while it
#: holds them (SO_REUSEPORT), which :func:`_check_free` would refuse.
_OURS: set[int] = set()


def _check_free(port: int) -> None:
    """Refuse a port another process listens on: with SO_REUSEPORT on both sides the bind
    would succeed, and the kernel would split the connections between the two.

    Raises:
        OSError: ``EADDRINUSE``, naming the port.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        probe.bind(("127.0.0.1", port))
    except OSError as exc:
        raise OSError(
            errno.EADDRINUSE, f"127.0.0.1:{port} is in use by another process ({exc.strerror})"
        ) from None
    finally:
        probe.close()
