"""One emulated namespace's server: its listener, keys and faults.

Each namespace listens on one loopback port. The first byte a client sends picks the
protocol: ``AMQP`` goes to Proton (the SDK's senders and receivers), ``0x16`` (a TLS
ClientHello) goes to the admin HTTPS endpoint, so ``ServiceBusAdministrationClient``
works with the namespace's own connection string (pass ``connection_verify`` the
emulator's CA file). Faults are applied per namespace without stopping the process, so
state survives an outage. ``_runner.EmulatorServer`` starts one per namespace, beside
the HTTP control endpoint (``_control``).
"""

from __future__ import annotations

__all__ = [
    "CONTROL_TOKEN_ENV",
    "DEFAULT_CONTROL_PORT",
    "DEFAULT_KEY_NAME",
    "DEFAULT_PORTS",
    "EXTRA_RULES",
    "NamespaceServer",
    "NamespaceSpec",
]

import asyncio
import base64
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from ._amqp import AmqpConnection
from ._broker import EntityProperties, Namespace
from ._entra import looks_like_jwt, verify_token
from ._faults import Faults
from ._namespace_host import ClientConnection
from ._relay import RelayServer
from ._sas import (
    LISTEN,
    MANAGE,
    SEND,
    SasGrant,
    SasRule,
    loopback_hosts,
    resource_host,
    resource_path,
    verify,
)
from ._sockets import bind_loopback
from ._websocket import WEBSOCKET_PATH, websocket_server

_LOG = logging.getLogger("georep.emulator")

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
#: Authorization rules every namespace has besides the root one, with their claims.
EXTRA_RULES = {"SendOnly": frozenset({SEND}), "ListenOnly": frozenset({LISTEN})}
# Away from RabbitMQ (5672), Redis (6379) and the AMQP/TLS default 5671.
DEFAULT_PORTS = (5700, 5701)
DEFAULT_CONTROL_PORT = 5710
#: The environment variable ``georep emulator`` and ``georep fault`` take the token from.
CONTROL_TOKEN_ENV = "GEOREP_EMULATOR_CONTROL_TOKEN"

_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost"})


@dataclass(frozen=True, kw_only=True)
class NamespaceSpec:
    """What one emulated namespace starts with."""

    name: str
    port: int = 0
    key_name: str = DEFAULT_KEY_NAME
    key: str = ""
    queues: tuple[str, ...] = ()
    session_queues: tuple[str, ...] = ()
    """Queues created with ``requires_session=True``."""
    topics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hybrid_connections: tuple[str, ...] = ()
    relay_port: int = 0


class NamespaceServer:
    """One namespace: broker state, its listener, SAS keys and faults."""

    def __init__(
        self, spec: NamespaceSpec, *, ssl_context: Any | None, admin_handler: Any | None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.key_name = spec.key_name
        self.key = spec.key or base64.b64encode(secrets.token_bytes(32)).decode()
        # The root rule has every claim; the others let tests check the claims the
        # service enforces (a send-only key cannot receive, a listen-only one cannot send).
        self.rules = {
            rule.name: rule
            for rule in (
                SasRule(self.key_name, self.key, frozenset({MANAGE, SEND, LISTEN})),
                *(
                    SasRule(name, base64.b64encode(secrets.token_bytes(32)).decode(), rights)
                    for name, rights in EXTRA_RULES.items()
                ),
            )
        }
        self.faults = Faults()
        self.connections: set[ClientConnection] = set()
        self.operations = 0
        self._idle_sockets: set[socket.socket] = set()
        self._ssl_context = ssl_context
        # The admin API's protocol factory; EmulatorServer sets it once its app is ready
        # (the app's backend needs this server first). None: other HTTP is refused.
        self.admin_handler = admin_handler
        self._websocket_handler: Any | None = None  # made on the first WebSocket upgrade
        self._listener: socket.socket | None = None
        # While down, the port stays bound (not listening, so connections are refused) and
        # no other process's ephemeral bind can take it before restore() listens again.
        self._reserved: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        # Strong references to in-flight _route tasks: the loop only keeps weak ones.
        self._route_tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.port = spec.port
        # The Hybrid Connections relay, on its own TLS port (EmulatorServer.start makes it).
        self.relay: RelayServer | None = None
        # Verifies Entra ID tokens the emulator's test credential signed (see _entra.py).
        self.entra_public_key: ec.EllipticCurvePublicKey | None = None
        self.namespace = Namespace(spec.name, on_timer_change=self._arm_timer)
        for queue in spec.queues:
            self.namespace.create_queue(queue)
        for queue in spec.session_queues:
            self.namespace.create_queue(queue, EntityProperties(requires_session=True))
        for topic, subscriptions in spec.topics.items():
            self.namespace.create_topic(topic)
            for subscription in subscriptions:
                self.namespace.create_subscription(topic, subscription)

    # -- identity ---------------------------------------------------------------------
    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://{self.host};SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key};UseDevelopmentEmulator=true"
        )

    def count_operation(self) -> None:
        self.operations += 1

    def grant(self, token: str, *, port: int | None = None) -> SasGrant:
        """Check a ``SharedAccessSignature`` token; return what it allows.

        Args:
            token: The token.
            port: The port the token must name (default: this namespace's AMQP port; the
                relay passes its own).

        Raises:
            PermissionError: the token is malformed, signed with an unknown rule or another
                key, expired, or names another namespace.
        """
        if looks_like_jwt(token) and self.entra_public_key is not None:
            # An Entra ID token covers the namespace; its role gives the claims.
            rights, expires, role = verify_token(token, self.entra_public_key)
            return SasGrant("", rights, expires, f"Entra ID role '{role}'")
        rule, resource, expiry = verify(token, self.rules, self.name)
        if not _same_host(resource, self.port if port is None else port, self.name):
            raise PermissionError(f"The SAS token is for '{resource}', not this namespace.")
        return SasGrant(resource_path(resource), rule.rights, expiry, rule.name)

    def verify_sas(
        self, token: str, audience: str | None = None, *, port: int | None = None
    ) -> float:
        """Check a token (see :meth:`grant`) and that it covers ``audience``; its expiry.

        Raises:
            PermissionError: as :meth:`grant`, or the token's scope does not cover the
                entity ``audience`` names.
        """
        granted = self.grant(token, port=port)
        if audience is not None:
            granted.require(resource_path(audience))
        return granted.expiry

    def connection_string_for(self, rule: str) -> str:
        """The connection string of the authorization rule ``rule``."""
        return (
            f"Endpoint=sb://{self.host};SharedAccessKeyName={rule};"
            f"SharedAccessKey={self.rules[rule].key};UseDevelopmentEmulator=true"
        )

    # -- timers -----------------------------------------------------------------------
    def _arm_timer(self, deadline: float) -> None:
        if self._timer_at is not None and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = deadline
        self._timer = loop.call_later(max(0.0, deadline - time.time()), self._fire_timers)

    def _fire_timers(self) -> None:
        self._timer = None
        self._timer_at = None
        self.namespace.run_timers()
        deadline = self.namespace.next_deadline()
        if deadline is not None:
            self._arm_timer(deadline)
        # No flush here: a delivery a timer causes schedules its own connection's flush.

    # -- listening ----------------------------------------------------------------------
    async def start(self) -> None:
        sock, self._reserved = self._reserved or self._bind(), None
        sock.listen(256)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._listener = sock
        self._accept_task = asyncio.create_task(
            self._accept_loop(sock), name=f"emulator-accept-{self.name}"
        )

    def _bind(self) -> socket.socket:
        return bind_loopback(self.port)

    async def stop_listening(self) -> None:
        if self._accept_task is not None:
            task, self._accept_task = self._accept_task, None
            task.cancel()
            # asyncio.wait, not an await inside suppress(CancelledError): that would
            # swallow the caller's own cancellation too.
            await asyncio.wait([task])
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            client, _ = await loop.sock_accept(listener)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.faults.paused:
                self._idle_sockets.add(client)  # accept, never answer
                continue
            task = asyncio.create_task(self._route(client))
            self._route_tasks.add(task)
            task.add_done_callback(self._route_tasks.discard)

    async def _route(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(30):
                first = await _peek(client)
        except (TimeoutError, OSError):
            client.close()
            return
        if not first or self.faults.down:
            client.close()
            return
        if self.faults.paused:
            self._idle_sockets.add(client)
            return
        try:
            if first[0] == 0x16 and self._ssl_context is not None:
                await loop.connect_accepted_socket(
                    lambda: _TlsRouter(self._after_tls), client, ssl=self._ssl_context
                )
            else:
                await loop.connect_accepted_socket(lambda: AmqpConnection(self), client)
        except (OSError, ConnectionError) as exc:
            _LOG.debug("emulator %s: connection setup failed: %s", self.name, exc)
            client.close()

    def _after_tls(self, first: bytes) -> asyncio.Protocol | None:
        """The protocol for a TLS connection whose first decrypted bytes are ``first``;
        None to wait for more. AMQP (``AMQP`` + version, plain or SASL) as on Azure's
        port 5671; the WebSocket upgrade to AMQP as on 443; any other HTTP is the admin API.
        """
        if first.startswith(b"AMQP"):
            return AmqpConnection(self)
        if len(first) < 4 and b"AMQP".startswith(first):
            return None
        request_line, newline, _ = first.partition(b"\r\n")
        if not newline and len(first) < 8192:
            return None
        path = request_line.split(b" ")[1:2]
        if path and path[0].split(b"?")[0].decode("latin-1") == WEBSOCKET_PATH:
            if self._websocket_handler is None:
                self._websocket_handler = websocket_server(self)
            return self._websocket_handler()
        if self.admin_handler is None:
            return None if newline else _Refuse()
        return self.admin_handler()  # type: ignore[no-any-return]

    # -- faults ---------------------------------------------------------------------------
    async def outage(self) -> None:
        """Refuse new connections and drop existing ones; keep every message."""
        self.faults.down = True
        # Hold the port (bound, not listening: a connection attempt is refused) before the
        # listener closes, so that no other process can take it before restore().
        if self._reserved is None and self._listener is not None:
            try:
                self._reserved = self._bind()
            except OSError as exc:  # restore() binds again, and says so if it cannot
                _LOG.warning(
                    "emulator %s: could not hold port %d while down: %s", self.name, self.port, exc
                )
        await self.stop_listening()
        self._drop_connections()
        if self.relay is not None:
            await self.relay.stop(hold_port=True)

    async def restore(self) -> None:
        """Clear every fault and listen again on the same port."""
        was_down = self.faults.down
        self.faults = Faults()
        self.namespace.restore_fragments()
        for sock in self._idle_sockets:
            sock.close()
        self._idle_sockets.clear()
        for connection in list(self.connections):
            if connection.paused:
                connection.abort()  # its stream lost bytes while blackholed
        if was_down or self._listener is None:
            await self.start()
        if self.relay is not None:
            self.relay.no_listener.clear()
            if was_down:
                await self.relay.start()

    def blackhole(self) -> None:
        """Accept connections but never answer, on new and existing connections."""
        self.faults.paused = True
        for connection in self.connections:
            connection.paused = True

    def fragment_down(self, entity: str, index: int) -> None:
        """Make fragment ``index`` of the partitioned queue or topic ``entity`` unavailable.

        Raises:
            BrokerError: no such entity, it is not partitioned, or ``index`` is not 0..15.
        """
        self.namespace.fragment_down(entity, index)

    def fragment_up(self, entity: str, index: int) -> None:
        """Bring fragment ``index`` of ``entity`` back (its held messages are delivered)."""
        self.namespace.fragment_up(entity, index)

    async def disaster(self) -> None:
        """An outage in which every message is lost (entities stay defined)."""
        await self.outage()
        self.namespace.purge()

    def _drop_connections(self) -> None:
        for connection in list(self.connections):
            connection.abort()
        for sock in self._idle_sockets:
            sock.close()
        self._idle_sockets.clear()

    async def close(self) -> None:
        await self.stop_listening()
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        self._drop_connections()
        if self.relay is not None:
            await self.relay.stop()
        if self._timer is not None:
            self._timer.cancel()

    # -- inspection -------------------------------------------------------------------------
    def describe_entities(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for entity in self.namespace.iter_entities():
            result[entity.path] = entity.runtime()
        return result


class _TlsRouter(asyncio.Protocol):
    """Reads the first decrypted bytes of a TLS connection, then hands the connection to
    the protocol they call for (see :meth:`NamespaceServer._after_tls`)."""

    def __init__(self, route: Callable[[bytes], asyncio.Protocol | None]) -> None:
        self._route = route
        self._transport: asyncio.Transport | None = None
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._buffer += data
        protocol = self._route(self._buffer)
        if protocol is None:
            return
        self._transport.set_protocol(protocol)
        protocol.connection_made(self._transport)
        protocol.data_received(self._buffer)

    def eof_received(self) -> bool | None:
        return None  # closed before saying what it speaks


class _Refuse(asyncio.Protocol):
    """Closes a connection nothing on this port can serve."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _same_host(resource: str, port: int, name: str) -> bool:
    # The audience names this namespace's endpoint: sb://127.0.0.1:PORT/..., https://...
    # Without a port too: over TLS the SDK connects to custom_endpoint_address and builds
    # audiences from the namespace's host alone (sb://127.0.0.1/q). Each namespace has its
    # own keys, so the signature still tells namespaces apart. Or by the namespace's own
    # host name, NAME.localhost (what Emulator.client_options gives, one host per region as
    # on Azure; the SDK connects to custom_endpoint_address, so it is never resolved).
    host = resource_host(resource)
    return (
        host in loopback_hosts(port)
        or host in _LOOPBACK_NAMES
        or host.split(":")[0] == f"{name.lower()}.localhost"
    )


async def _peek(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return sock.recv(1, socket.MSG_PEEK)
