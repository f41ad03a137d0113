"""AMQP 1.0 connections for one emulated namespace, on Proton's engine under asyncio.

Proton's engine (``Transport``/``Connection``/``Collector``) does framing, SASL, sessions,
links and flow control; this module feeds it bytes from an :class:`asyncio.Protocol`,
reacts to its events, and maps links onto the broker: ``$cbs`` (SAS put-token),
``<entity>/$management`` (schedule, peek, renew-lock, deferred, update-disposition) and
entity links for sending and receiving. Driving the engine from asyncio, rather than
Proton's own reactor, keeps every namespace, the admin HTTPS endpoint and the control
endpoint on one event loop, with no cross-thread state.
"""

from __future__ import annotations

__all__ = ["AmqpConnection"]

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from proton import (
    Collector,
    Condition,
    Connection,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Terminus,
    Transport,
    symbol,
)

from ._broker import BrokerError, Entity, StoredMessage
from ._codec import (
    SECTION_AMQP_VALUE,
    AmqpDecodeError,
    Raw,
    Timestamp,
    decode_value,
    encode_value,
    long_array,
    section_value_start,
    split_sections,
    timestamp_array,
)
from ._frames import DeliveryIdSequencer
from ._namespace_host import NamespaceHost
from ._sas import LISTEN, SEND, SasGrant
from ._sessions import (
    DEFAULT_ACCEPT_TIMEOUT,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    Session,
    Sessions,
)

_LOG = logging.getLogger("georep.emulator.amqp")

_TRACKING_ID = symbol("com.microsoft:tracking-id")
_SESSION_FILTER = symbol("com.microsoft:session-filter")
_LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
_OPERATION_TIMEOUT = "com.microsoft:timeout"
# .NET ticks (100 ns) at the Unix epoch: the SDK reads locked-until-utc as DateTimeOffset ticks.
_EPOCH_TICKS = 621355968000000000
_RECEIVE_CREDIT_WINDOW = 1000
_MAX_MESSAGE_SIZE = 256 * 1024
_UNAUTHORIZED = "amqp:unauthorized-access"
# How a $management answer reports a broker refusal (anything else is a bad request, 400).
_MANAGEMENT_STATUS = {
    "amqp:not-found": 404,
    "com.microsoft:message-not-found": 404,
    _UNAUTHORIZED: 401,
    "com.microsoft:message-lock-lost": 410,
    SESSION_LOCK_LOST: 410,
    SESSION_CANNOT_BE_LOCKED: 409,
}


def _condition(name: str, description: str) -> Condition:
    # Proton drops trailing nulls, and the SDK indexes error[2]: always send an info map.
    return Condition(name, description, {_TRACKING_ID: str(uuid.uuid4())})


def entity_path(address: str | None) -> str:
    """The entity path of a link address (``amqps://host:port/q1`` -> ``q1``)."""
    if not address:
        return ""
    if "://" in address:
        address = urlsplit(address).path
    return address.strip("/")


@dataclass(slots=True, eq=False)
class _ConsumerLink:
    """A server-side sender link that delivers an entity's messages to a client receiver."""

    connection: AmqpConnection
    link: Link
    entity: Entity
    receive_and_delete: bool
    session: Session | None = None
    """The session this link holds (session-enabled entities), else None."""

    def session_lost(self, error: BrokerError) -> None:
        """The session lock expired or was taken away: detach, as the service does."""
        self.connection.drop_consumer(self.link, (error.condition, error.description))

    @property
    def credit(self) -> int:
        if self.connection.paused:
            return 0
        return int(self.link.credit)

    def deliver(self, message: StoredMessage, lock_token: uuid.UUID | None) -> None:
        link = self.link
        # The SDK reads the lock token as UUID(bytes_le=tag).
        tag = lock_token.bytes_le if lock_token is not None else self.connection.next_tag()
        delivery = link.delivery(tag)
        # Proton hands tags back as UTF-8-decoded text, which a binary tag is not: keep the
        # token on the delivery's record instead.
        delivery.lock_token = lock_token
        link.send(message.encode(lock_token=lock_token))
        link.advance()
        if self.receive_and_delete:
            delivery.settle()
        self.connection.schedule_flush()


class _SessionAttach:
    """A session receiver's attach, answered once its session is locked (or refused)."""

    __slots__ = ("connection", "entity", "holder", "link")

    def __init__(self, connection: AmqpConnection, link: Link, entity: Entity) -> None:
        self.connection = connection
        self.link = link
        self.entity = entity
        self.holder = _ConsumerLink(connection, link, entity, _receive_and_delete(link))

    def accepted(self, session: Session) -> None:
        self.holder.session = session
        self.connection.session_wait_ended(self.link)
        self.connection.add_consumer(self.holder)
        self.connection.open_session_link(self.link, session)

    def timed_out(self) -> None:
        # What the service answers when no session frees up within the wait.
        self.connection.refuse_later(
            self.link,
            _OPERATION_TIMEOUT,
            f"No session of '{self.entity.path}' with messages became available within "
            "the receiver's max_wait_time. Send messages with a session_id, or wait longer.",
        )


def _receive_and_delete(link: Link) -> bool:
    return bool(link.remote_snd_settle_mode == Link.SND_SETTLED)


def _session_filter(filters: Any) -> tuple[bool, str | None]:
    """Whether the source asks for a session, and which (None: the next available)."""
    if filters is None:
        return False, None
    filters.rewind()
    if filters.next() is None:
        return False, None
    value = filters.get_object()
    if not isinstance(value, dict):
        return False, None
    for key, session_id in value.items():
        if str(key) == str(_SESSION_FILTER):
            return True, None if session_id is None else str(session_id)
    return False, None


def _check_session_receiver(entity: Entity, path: str, wants_session: bool) -> None:
    """A session receiver needs a session-enabled entity, and such an entity refuses any
    other receiver (the service's ``amqp:not-allowed``; the SDK raises ``ServiceBusError``).
    """
    if wants_session and entity.sessions is None:
        raise BrokerError(
            "amqp:not-allowed",
            "A sessionful message receiver cannot be created on an entity that does not "
            f"require sessions ('{path}'). Ensure RequiresSession is set to true when creating "
            "a Queue or Subscription to enable sessionful behavior.",
        )
    if not wants_session and entity.sessions is not None:
        raise BrokerError(
            "amqp:not-allowed",
            "It is not possible for an entity that requires sessions to create a "
            f"non-sessionful message receiver ('{path}' requires sessions: pass session_id, "
            "or NEXT_AVAILABLE_SESSION, to get_queue_receiver/get_subscription_receiver).",
        )


class AmqpConnection(asyncio.Protocol):
    """One client connection to a namespace."""

    def __init__(self, server: NamespaceHost) -> None:
        self.server = server
        self.namespace = server.namespace
        self.transport: asyncio.Transport | None = None
        self.paused = False  # blackholed: read nothing, answer nothing
        self._engine = Transport(Transport.SERVER)
        sasl = self._engine.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self._connection = Connection()
        self._collector = Collector()
        self._connection.collect(self._collector)
        self._engine.bind(self._connection)
        # The SDK can number concurrent transfers out of order; Proton would close the
        # connection (see _frames).
        self._sequencer = DeliveryIdSequencer()
        self._flush_scheduled = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._consumers: dict[Link, _ConsumerLink] = {}
        self._session_waits: dict[Link, _SessionAttach] = {}
        self._tokens: dict[str, SasGrant] = {}  # audience -> what its token allows
        self._tag_counter = 0
        self._closed = False

    # -- asyncio protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        # A connection accepted before a fault and set up after it (its socket was being
        # handed to the loop while outage() dropped the others, or blackhole() paused them)
        # meets the fault as the others did: it must not outlive an outage or answer in a
        # blackhole.
        faults = self.server.faults
        if faults.down:
            transport.abort()
        elif faults.paused:
            self.paused = True

    def data_received(self, data: bytes) -> None:
        if self.paused:
            return
        delay = self.server.faults.latency
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._feed, data)
        else:
            self._feed(data)

    def eof_received(self) -> bool | None:
        self._engine.close_tail()
        self._process()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        # Azure releases a session when its link goes: the next receiver may lock it.
        for link in list(self._consumers):
            self._forget_consumer(link)
        for link in list(self._session_waits):
            self._forget_consumer(link)
        if self._tick_handle is not None:
            self._tick_handle.cancel()

    # -- engine plumbing ----------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        if self._closed or self.paused:
            return
        engine = self._engine
        view = memoryview(self._sequencer.incoming(data))
        while view:
            capacity = engine.capacity()
            if capacity <= 0:
                # The engine refuses input (closed tail): nothing more to read.
                break
            chunk = view[:capacity]
            engine.push(bytes(chunk))
            view = view[capacity:]
            self._process()
        self._process()

    def _process(self) -> None:
        collector = self._collector
        while True:
            event = collector.peek()
            if event is None:
                break
            try:
                self._dispatch(event)
            except Exception:  # one bad frame must not take the namespace down
                _LOG.exception("emulator: error handling %s", event.type)
            collector.pop()
        self._flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed or self.transport is None:
            return
        engine = self._engine
        if self.paused:
            return
        # Deliveries made by other connections queue events here too: process them.
        if self._collector.peek() is not None:
            self._process()
            return
        while True:
            pending = engine.pending()
            if pending < 0:
                self.transport.close()
                self._closed = True
                return
            if pending == 0:
                break
            self.transport.write(self._sequencer.outgoing(engine.peek(pending)))
            engine.pop(pending)
        self._arm_tick()

    def _arm_tick(self) -> None:
        if self._engine.remote_idle_timeout <= 0 and self._engine.idle_timeout <= 0:
            return
        deadline = self._engine.tick(time.monotonic())
        if deadline and self._tick_handle is None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, deadline - time.monotonic())
            self._tick_handle = loop.call_later(delay, self._on_tick)

    def _on_tick(self) -> None:
        self._tick_handle = None
        self._flush()

    def abort(self) -> None:
        """Drop the TCP connection now (an outage)."""
        if self.transport is not None:
            self.transport.abort()

    def next_tag(self) -> bytes:
        self._tag_counter += 1
        return self._tag_counter.to_bytes(8, "big")

    # -- events ---------------------------------------------------------------------
    def _dispatch(self, event: Event) -> None:
        kind = event.type
        if kind == Event.DELIVERY:
            delivery = event.delivery
            if delivery.link.is_receiver:
                self._on_transfer(delivery)
            else:
                self._on_disposition(delivery)
        elif kind == Event.LINK_FLOW:
            consumer = self._consumers.get(event.link)
            if consumer is not None:
                consumer.entity.dispatch()
                if event.link.drain_mode:
                    event.link.drained()
        elif kind == Event.CONNECTION_REMOTE_OPEN:
            self._connection.container = f"georep-emulator-{self.namespace.name}"
            self._connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            self._on_attach(event.link)
        elif kind == Event.LINK_REMOTE_CLOSE:
            self._forget_consumer(event.link)
            if not event.link.state & Endpoint.LOCAL_CLOSED:
                event.link.close()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            if not event.session.state & Endpoint.LOCAL_CLOSED:
                event.session.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            if not self._connection.state & Endpoint.LOCAL_CLOSED:
                self._connection.close()
        elif kind == Event.TRANSPORT_CLOSED and self.transport is not None:
            self._flush_scheduled = False
            self.transport.close()

    # -- links --------------------------------------------------------------------------
    def _forget_consumer(self, link: Link) -> None:
        """The link is gone: stop delivering to it and free the session it holds or awaits."""
        consumer = self._consumers.pop(link, None)
        if consumer is not None:
            consumer.entity.remove_consumer(consumer)
            if consumer.session is not None and consumer.entity.sessions is not None:
                consumer.entity.sessions.release(consumer)
        waiting = self._session_waits.pop(link, None)
        if waiting is not None and waiting.entity.sessions is not None:
            waiting.entity.sessions.withdraw(waiting)

    def add_consumer(self, consumer: _ConsumerLink) -> None:
        self._consumers[consumer.link] = consumer

    def _holder(self, link_name: str | None) -> _ConsumerLink | None:
        """The receiver link a management request names as its associated link."""
        for consumer in self._consumers.values():
            if consumer.link.name == link_name:
                return consumer
        return None

    def drop_consumer(self, link: Link, condition: tuple[str, str]) -> None:
        """Detach a receiver's link with an error (its session lock was lost)."""
        self._forget_consumer(link)
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.condition = _condition(*condition)
            link.close()
        self.schedule_flush()

    def _refuse(self, link: Link, name: str, description: str) -> None:
        # Attach with a null terminus, then detach with the error: echoing the client's
        # terminus first would make the SDK believe the link opened.
        link.source.type = Terminus.UNSPECIFIED
        link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _condition(name, description)
        link.close()

    def _on_attach(self, link: Link) -> None:
        if link.is_sender:
            address = link.remote_source.address or ""
        else:
            address = link.remote_target.address or ""
        path = entity_path(address)
        link.max_message_size = _MAX_MESSAGE_SIZE
        if path == "$cbs" or path.endswith("/$management") or path == "$management":
            self._open_echo(link)
            if link.is_receiver:
                link.flow(_RECEIVE_CREDIT_WINDOW)
            return
        try:
            # The client receives through our sender links and sends through our receivers.
            self._authorize(path, LISTEN if link.is_sender else SEND)
            if link.is_sender:
                entity = self.namespace.resolve_source(path)
                wants_session, session_id = _session_filter(link.remote_source.filter)
                _check_session_receiver(entity, path, wants_session)
                if wants_session:
                    self._attach_session_receiver(link, entity, session_id)
                    return
            else:
                self.namespace.resolve_target(path)
        except BrokerError as exc:
            self._refuse(link, exc.condition, exc.description)
            return
        self._open_echo(link)
        if link.is_sender:
            consumer = _ConsumerLink(self, link, entity, _receive_and_delete(link))
            self._consumers[link] = consumer
            entity.add_consumer(consumer)
        else:
            link.flow(_RECEIVE_CREDIT_WINDOW)

    def _attach_session_receiver(self, link: Link, entity: Entity, session_id: str | None) -> None:
        """Lock the named session, or the next available one (waiting up to the link's
        ``com.microsoft:timeout``), then open the link naming it.

        Raises:
            BrokerError: the named session is locked by another receiver.
        """
        sessions = entity.sessions
        assert sessions is not None
        attach = _SessionAttach(self, link, entity)
        if session_id is not None:
            sessions.accept(attach, session_id)
            return
        properties = link.remote_properties or {}
        timeout_ms = properties.get(symbol(_OPERATION_TIMEOUT))
        timeout = int(timeout_ms) / 1000 if timeout_ms else DEFAULT_ACCEPT_TIMEOUT
        self._session_waits[link] = attach
        if sessions.accept_next(attach, timeout):
            self._session_waits.pop(link, None)

    def open_session_link(self, link: Link, session: Session) -> None:
        """Open a session receiver's link: its source names the session it holds."""
        self._open_echo(link, opened=False)
        link.source.filter.clear()
        link.source.filter.put_object({_SESSION_FILTER: session.session_id})
        ticks = _EPOCH_TICKS + int(session.locked_until * 10_000_000)
        link.properties = {_LOCKED_UNTIL_UTC: ticks}
        link.open()
        self.schedule_flush()

    def session_wait_ended(self, link: Link) -> None:
        self._session_waits.pop(link, None)

    def refuse_later(self, link: Link, name: str, description: str) -> None:
        """Refuse a link whose attach was left waiting (flushing, as no frame will)."""
        self._session_waits.pop(link, None)
        if not link.state & Endpoint.LOCAL_CLOSED:
            self._refuse(link, name, description)
        self.schedule_flush()

    def _open_echo(self, link: Link, *, opened: bool = True) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if opened:
            link.open()

    def _authorize(self, path: str, right: str) -> None:
        """Some token put on $cbs covers ``path`` (by its ``sr``) and carries ``right``.

        Raises:
            BrokerError: ``amqp:unauthorized-access`` (SDK: ``ServiceBusAuthorizationError``).
        """
        grants = list(self._tokens.values())
        if any(grant.allows(path, right) for grant in grants):
            return
        now = time.time()
        if any(grant.covers(path) and grant.expiry > now for grant in grants):
            raise BrokerError(
                _UNAUTHORIZED,
                f"Unauthorized access. '{right}' claim(s) are required to perform this "
                f"operation on '{path}'.",
            )
        raise BrokerError(
            _UNAUTHORIZED,
            f"Unauthorized access to '{path}': put a valid SAS token for it on $cbs first.",
        )

    # -- incoming transfers -------------------------------------------------------------
    def _on_transfer(self, delivery: Delivery) -> None:
        if delivery.partial or not delivery.readable:
            return
        link = delivery.link
        payload = link.recv(delivery.pending) or b""
        link.advance()
        if link.credit < _RECEIVE_CREDIT_WINDOW // 2:
            link.flow(_RECEIVE_CREDIT_WINDOW - link.credit)
        path = entity_path(link.remote_target.address)
        if path == "$cbs":
            self._on_cbs_request(link, delivery, payload)
        elif path.endswith("$management"):
            self._on_management_request(link, delivery, payload, path)
        else:
            self._on_entity_send(delivery, payload, path)

    def _settle(self, delivery: Delivery, condition: tuple[str, str] | None = None) -> None:
        if condition is None:
            delivery.update(Delivery.ACCEPTED)
        else:
            delivery.local.condition = _condition(*condition)
            delivery.update(Delivery.REJECTED)
        delivery.settle()

    def _on_entity_send(self, delivery: Delivery, payload: bytes, path: str) -> None:
        faults = self.server.faults
        if faults.reject_sends is not None:
            self._settle(delivery, faults.reject_condition())
            return
        try:
            target = self.namespace.resolve_target(path)
            self.server.count_operation()
            self.namespace.send(target, payload)
        except BrokerError as exc:
            self._settle(delivery, (exc.condition, exc.description))
            return
        except AmqpDecodeError as exc:
            self._settle(delivery, ("amqp:decode-error", f"Malformed message: {exc}"))
            return
        if faults.take_dropped_disposition():
            return  # stored, never answered: the seed's "duplicate reception" hazard
        self._settle(delivery)

    # -- dispositions from receivers ----------------------------------------------------
    def _on_disposition(self, delivery: Delivery) -> None:
        if not delivery.updated:
            return
        consumer = self._consumers.get(delivery.link)
        remote_state = delivery.remote_state
        if consumer is None and delivery.link.state & Endpoint.LOCAL_CLOSED:
            # We detached the link (a lost session lock): the service answers nothing more
            # on it. (pyamqp would match a stray disposition to its own delivery id.)
            return
        if consumer is None or consumer.receive_and_delete or remote_state is None:
            delivery.settle()
            return
        token = getattr(delivery, "lock_token", None)
        if token is None:
            delivery.settle()
            return
        entity = consumer.entity
        if self.server.faults.paused:
            return
        if self.server.faults.take_lost_settlement():
            return  # lost on the way: never applied, never answered; the lock runs out
        try:
            if remote_state == Delivery.ACCEPTED:
                entity.complete(token)
                delivery.update(Delivery.ACCEPTED)
            elif remote_state == Delivery.MODIFIED:
                # The SDK: abandon = modified(delivery-failed), defer = modified(
                # delivery-failed, undeliverable-here). Without delivery-failed the
                # attempt does not count (AMQP 3.4.5).
                if delivery.remote.undeliverable:
                    entity.defer(token)
                    delivery.local.undeliverable = True
                elif delivery.remote.failed:
                    entity.abandon(token)
                else:
                    entity.release(token)
                delivery.local.failed = delivery.remote.failed
                delivery.update(Delivery.MODIFIED)
            elif remote_state == Delivery.REJECTED:
                reason, description = _dead_letter_details(delivery.remote.condition)
                entity.dead_letter_by_token(token, reason, description)
                delivery.update(Delivery.REJECTED)
            elif remote_state == Delivery.RELEASED:
                entity.release(token)
                delivery.update(Delivery.RELEASED)
            else:
                return  # a non-terminal state (received): wait for the outcome
        except BrokerError as exc:
            delivery.local.condition = _condition(exc.condition, exc.description)
            delivery.update(Delivery.REJECTED)
        delivery.settle()
        self.schedule_flush()

    # -- $cbs ----------------------------------------------------------------------------
    def _on_cbs_request(self, link: Link, delivery: Delivery, payload: bytes) -> None:
        self._settle(delivery)
        request = Message()
        request.decode(payload)
        props = request.properties or {}
        audience = str(props.get("name", ""))
        token = (
            request.body
            if isinstance(request.body, str)
            else (request.body or b"").decode("utf-8", "replace")
        )
        try:
            granted = self.server.grant(token)
            # The service checks the token's own resource, not the name it is put for.
            granted.require(entity_path(audience))
        except PermissionError as exc:
            status, description = 401, str(exc)
        else:
            self._tokens[audience] = granted
            status, description = 202, "Accepted"
        response = Message(
            correlation_id=request.id,
            properties={"status-code": status, "status-description": description},
        )
        self._reply(link, request, response.encode())

    def _reply(self, request_link: Link, request: Message, encoded: bytes) -> None:
        """Send a $cbs or $management response on the link the client reads replies from.

        That is the sender link whose target is the request's reply-to address, else the one
        whose source is the address the request was sent to (the SDK pairs them that way).
        """
        request_address = request_link.remote_target.address
        reply_link = None
        link = self._connection.link_head(Endpoint.LOCAL_ACTIVE)
        while link is not None:
            if link.is_sender:
                if request.reply_to and link.remote_target.address == request.reply_to:
                    reply_link = link
                    break
                if reply_link is None and link.remote_source.address == request_address:
                    reply_link = link
            link = link.next(Endpoint.LOCAL_ACTIVE)
        if reply_link is None:
            _LOG.warning("emulator: no reply link for %s", request_address)
            return
        reply_link.delivery(self.next_tag())
        reply_link.send(encoded)
        reply_link.advance()

    # -- $management -------------------------------------------------------------------
    def _on_management_request(
        self, link: Link, delivery: Delivery, payload: bytes, path: str
    ) -> None:
        self._settle(delivery)
        request = Message()
        request.decode(payload)
        properties, body = self.management_answer(
            str((request.properties or {}).get("operation", "")),
            path[: -len("$management")].rstrip("/"),
            payload,
            self._holder((request.properties or {}).get("associated-link-name")),
        )
        encoded = Message(correlation_id=request.id, properties=properties).encode()
        if body is not None:
            # Append our own amqp-value section so typed arrays survive exactly.
            encoded += b"\x00\x53\x77" + encode_value(body)
        self._reply(link, request, encoded)

    def management_answer(
        self, operation: str, path: str, payload: bytes, holder: _ConsumerLink | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Run one ``$management`` request on the entity ``path``: the answer's application
        properties (``statusCode``, ``statusDescription``, ``errorCondition``) and body.

        The operation's claim is checked first, so an unknown operation without a token is
        401; with one it is 400 ``amqp:not-implemented``.
        """
        handler = _MANAGEMENT.get(operation)
        status, description, body = 200, "OK", None
        error_condition: str | None = None
        try:
            self._authorize(path, LISTEN if handler is None else handler.right)
            # The body is an AMQP map whose values the SDK encodes with precise types:
            # decode it with our codec (Proton's Message converts arrays and uuids less
            # predictably).
            request_body = _decode_body(payload)
            if handler is None:
                raise BrokerError(
                    "amqp:not-implemented",
                    f"Management operation '{operation}' is not supported by the emulator.",
                )
            body = handler.run(self, path, request_body, holder)
            if body is None:
                status, description = 204, "No Content"
        except BrokerError as exc:
            status = _MANAGEMENT_STATUS.get(exc.condition, 400)
            description, error_condition = exc.description, exc.condition
        except (AmqpDecodeError, KeyError, TypeError, ValueError) as exc:
            status, description, error_condition = (
                400,
                f"Bad management request: {exc}",
                "amqp:decode-error",
            )
        properties: dict[str, Any] = {"statusCode": status, "statusDescription": description}
        if error_condition:
            properties["errorCondition"] = symbol(error_condition)
        return properties, body

    # Each handler: the entity path, the request's body, the receiver link the request names
    # (or None) -> the answer's body, or None for 204 No Content.
    def _schedule_messages(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        target = self.namespace.resolve_target(path)
        numbers = []
        for scheduled in body["messages"]:
            numbers.append(self.namespace.schedule(target, scheduled["message"], None))
            self.server.count_operation()
        return {"sequence-numbers": Raw(long_array(numbers))}

    def _cancel_scheduled(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        target = self.namespace.resolve_target(path)
        self.namespace.cancel_scheduled(target, [int(n) for n in body["sequence-numbers"]])
        return {}

    def _renew_lock(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        entity = self.namespace.resolve_source(path)
        expirations = [int(entity.renew_lock(token) * 1000) for token in body["lock-tokens"]]
        return {"expirations": Raw(timestamp_array(expirations))}

    def _peek(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        session_id = _text(body.get("session-id"))
        entity = self.namespace.resolve_source(path)
        start = int(body.get("from-sequence-number", 0))
        count = int(body.get("message-count", 1))
        found = entity.peek(start, count, session_id)
        if not found:
            return None
        return {"messages": [{"message": m.encode()} for m in found]}

    def _receive_by_sequence_number(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        session_id = _text(body.get("session-id"))
        entity = self.namespace.resolve_source(path)
        receive_and_delete = int(body.get("receiver-settle-mode", 1)) == 0
        if entity.sessions is not None:
            entity.sessions.held(session_id or "", holder)
        received = entity.receive_deferred(
            [int(n) for n in body["sequence-numbers"]], receive_and_delete, session_id
        )
        messages: list[dict[str, Any]] = []
        for message, token in received:
            item: dict[str, Any] = {"message": message.encode(lock_token=token)}
            if token is not None:
                item["lock-token"] = token
            messages.append(item)
        return {"messages": messages}

    def _update_disposition(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        entity = self.namespace.resolve_source(path)
        status = str(body["disposition-status"])
        for token in body["lock-tokens"]:
            if status == "completed":
                entity.complete(token)
            elif status == "abandoned":
                entity.abandon(token)
            elif status == "defered":
                entity.defer(token)
            elif status == "suspended":
                entity.dead_letter_by_token(
                    token, body.get("deadletter-reason"), body.get("deadletter-description")
                )
            else:
                raise BrokerError("amqp:invalid-field", f"Unknown disposition status '{status}'.")
        return {}

    def _sessions(self, path: str) -> Sessions:
        """The sessions of the entity ``path``.

        Raises:
            BrokerError: ``amqp:not-allowed``, the entity is not session-enabled.
        """
        entity = self.namespace.resolve_source(path)
        if entity.sessions is None:
            raise BrokerError(
                "amqp:not-allowed",
                f"'{path}' is not session-enabled: session operations need an entity created "
                "with requires_session=True.",
            )
        return entity.sessions

    def _renew_session_lock(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        sessions = self._sessions(path)
        expiry = sessions.renew(_text(body.get("session-id")) or "", holder)
        return {"expiration": Timestamp(int(expiry * 1000))}

    def _get_session_state(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        sessions = self._sessions(path)
        return {"session-state": sessions.get_state(_text(body.get("session-id")) or "", holder)}

    def _set_session_state(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        sessions = self._sessions(path)
        state = body.get("session-state")
        session_id = _text(body.get("session-id")) or ""
        sessions.set_state(session_id, holder, None if state is None else bytes(state))
        return {}

    def _list_sessions(
        self, path: str, body: dict[str, Any], holder: _ConsumerLink | None
    ) -> dict[str, Any] | None:
        sessions = self._sessions(path)
        updated = body.get("last-updated-time")
        since = None if updated is None or int(updated) >= _LIST_ALL_SESSIONS_MS else updated / 1000
        skip = int(body.get("skip", 0))
        found = sessions.list(since, skip, int(body.get("top", 100)))
        if not found:
            return None  # 204, as the service answers an empty page
        return {"skip": skip + len(found), "sessions-ids": found}


_ManagementHandler = Callable[
    [AmqpConnection, str, dict[str, Any], _ConsumerLink | None], dict[str, Any] | None
]


@dataclass(frozen=True, slots=True)
class _ManagementOperation:
    """A ``$management`` operation: its handler and the claim its token must carry."""

    run: _ManagementHandler
    right: str = LISTEN
    """Send to schedule or cancel; reading and settling (everything else) need Listen."""


#: The ``$management`` operations the emulator serves (the SDK's names): a new one is one
#: row, and any other is answered 400 ``amqp:not-implemented``.
_MANAGEMENT: Final[dict[str, _ManagementOperation]] = {
    "com.microsoft:schedule-message": _ManagementOperation(AmqpConnection._schedule_messages, SEND),
    "com.microsoft:cancel-scheduled-message": _ManagementOperation(
        AmqpConnection._cancel_scheduled, SEND
    ),
    "com.microsoft:renew-lock": _ManagementOperation(AmqpConnection._renew_lock),
    "com.microsoft:peek-message": _ManagementOperation(AmqpConnection._peek),
    "com.microsoft:receive-by-sequence-number": _ManagementOperation(
        AmqpConnection._receive_by_sequence_number
    ),
    "com.microsoft:update-disposition": _ManagementOperation(AmqpConnection._update_disposition),
    "com.microsoft:renew-session-lock": _ManagementOperation(AmqpConnection._renew_session_lock),
    "com.microsoft:get-session-state": _ManagementOperation(AmqpConnection._get_session_state),
    "com.microsoft:set-session-state": _ManagementOperation(AmqpConnection._set_session_state),
    "com.microsoft:get-message-sessions": _ManagementOperation(AmqpConnection._list_sessions),
}

# The SDK's "no filter" last-updated-time: DateTime.MaxValue as .NET encodes it, in ms.
_LIST_ALL_SESSIONS_MS = 253402300800000


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return None if value is None else str(value)


def _decode_body(payload: bytes) -> dict[str, Any]:
    """Decode the amqp-value body of a management request into a str-keyed dict."""
    for code, start, _end in split_sections(payload):
        if code == SECTION_AMQP_VALUE:
            value, _ = decode_value(payload, section_value_start(payload, start))
            if not isinstance(value, dict):
                raise AmqpDecodeError("management body is not a map")
            return {str(k): v for k, v in value.items()}
    return {}


def _dead_letter_details(condition: Condition | None) -> tuple[str | None, str | None]:
    if condition is None:
        return None, None
    info = condition.info or {}
    reason = info.get("DeadLetterReason") or info.get(symbol("DeadLetterReason"))
    description = info.get("DeadLetterErrorDescription") or info.get(
        symbol("DeadLetterErrorDescription")
    )
    return (
        str(reason) if reason is not None else None,
        str(description) if description is not None else condition.description,
    )
