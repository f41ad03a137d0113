"""A region's sender, receiver and sessions, what they say of a failure (ErrorKind) and of a
received copy (Delivery, OrderStamp).
"""

from __future__ import annotations

__all__ = [
    "Delivery",
    "ErrorKind",
    "OrderStamp",
    "RegionIdentity",
    "RegionReceiver",
    "RegionSender",
    "RegionSessions",
    "SessionReceiver",
]

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from georep._slot import RegionSlot
from georep.ports.codec import MessageCodec


class ErrorKind(enum.StrEnum):
    """What a failed Service Bus operation says about its region.

    Adapters translate their client's exceptions into one of these; the failover policy
    decides, per kind, whether the other region should be tried.
    """

    CONNECTION = "connection"
    """The connection could not be opened or was lost: the region may be unavailable."""
    TIMEOUT = "timeout"
    """No answer within the deadline (the service's or georep's own)."""
    SERVICE_ERROR = "service-error"
    """The service failed internally (``amqp:internal-error`` and the like)."""
    SERVER_BUSY = "server-busy"
    """The namespace is throttling requests."""
    QUOTA_EXCEEDED = "quota-exceeded"
    """The entity or namespace is full."""
    AUTHENTICATION = "authentication"
    """The key or token was refused."""
    ENTITY_NOT_FOUND = "entity-not-found"
    """The queue or topic does not exist in that namespace."""
    ENTITY_DISABLED = "entity-disabled"
    """The queue or topic exists but is disabled."""
    MESSAGE_TOO_LARGE = "message-too-large"
    """The message or batch is over the entity's size limit."""
    LOCK_LOST = "lock-lost"
    """A received copy's lock expired before it was settled; it will be redelivered."""
    INVALID_ARGUMENT = "invalid-argument"
    """The request itself is wrong (bad property, bad schedule time, ...)."""
    UNKNOWN = "unknown"
    """Anything else."""


@runtime_checkable
class RegionIdentity(Protocol):
    """What every region object of the Service Bus ports answers to.

    Implementations inherit these from ``georep._region_identity.RegionLabels``.
    """

    @property
    def region(self) -> str:
        """The region's label in georep's results, errors and telemetry (``"primary"``)."""
        ...

    @property
    def namespace(self) -> str:
        """The fully qualified namespace, e.g. ``contoso-east.servicebus.windows.net``."""
        ...

    @property
    def entity(self) -> str:
        """The entity path: the queue or topic a sender sends to; the queue, or
        ``topic/Subscriptions/subscription``, a receiver reads."""
        ...


@runtime_checkable
class RegionSender(RegionIdentity, Protocol):
    """One region's sender for one entity (queue or topic).

    Every method raises :class:`georep.exceptions.RegionError` (with its
    :class:`ErrorKind`) and nothing else for a failed operation; build it with
    :func:`georep.exceptions.region_error`, which picks the class for the kind.
    """

    @property
    def codec(self) -> MessageCodec:
        """How to read and copy the messages this sender sends."""
        ...

    def slot(self) -> RegionSlot:
        """Held around every call georep makes to this region.

        One slot per underlying client sender, shared by every wrapper of it: the
        azure-servicebus async sender allows one call at a time. georep's deadline for a
        call starts once the slot is held.
        """
        ...

    async def send(self, messages: Any, *, timeout: float) -> None:
        """Send one message, a list of messages (as one batch), or a batch."""
        ...

    async def schedule(
        self, messages: Sequence[Any], schedule_time_utc: datetime, *, timeout: float
    ) -> list[int]:
        """Schedule messages; return their sequence numbers in this region."""
        ...

    async def cancel_scheduled(self, sequence_numbers: Sequence[int], *, timeout: float) -> None:
        """Cancel scheduled messages by this region's sequence numbers."""
        ...

    async def max_message_size(self, *, timeout: float) -> int:
        """The largest message or batch the entity accepts, in bytes (may be cached)."""
        ...

    async def probe(self, *, timeout: float) -> None:
        """One round trip to the entity that changes nothing; raises if it fails."""
        ...

    async def close(self) -> None:
        """Close what this adapter created (never the caller's client)."""
        ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a receiver knows about one received copy.

    Attributes:
        key: The dedup key's value (None when the copy lacks it: processed unchecked).
        delivery_count: The broker's delivery count (1 on first delivery).
        enqueued_at: Wall-clock seconds when the region stored it, if known.
        locked_until: Wall-clock seconds when its lock expires, if known.
        traceparent: The producer's W3C traceparent, if the copy carries one.
        content_type: The copy's content type, if set (the paired namespaces' ping is
            recognised by it).
        session_id: The copy's session id, if it has one.
        stamp: The session order its sender stamped (docs/sessions.md), if any.
    """

    key: str | None
    delivery_count: int
    enqueued_at: float | None
    locked_until: float | None
    traceparent: str | None
    content_type: str | None = None
    session_id: str | None = None
    stamp: OrderStamp | None = None


@dataclass(frozen=True, slots=True)
class OrderStamp:
    """One message's place in its session, as a GeoSender stamped it (docs/sessions.md).

    Attributes:
        writer: The GeoSender object that numbered it.
        seq: Its number in the session, per writer (from 1).
        prev: The dedup key of the writer's previous message of the session (None: first).
        generation: The role generation when its send started.
    """

    writer: str
    seq: int
    prev: str | None
    generation: int


@runtime_checkable
class RegionReceiver(RegionIdentity, Protocol):
    """One region's peek-lock receiver for one queue or subscription.

    georep calls it from one task at a time (the SDK's receivers are not safe for
    concurrent calls). Failed operations raise :class:`georep.exceptions.RegionError`.
    """

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        """Read a copy's key and delivery details (``dedup_source`` as in DedupKey)."""
        ...

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        """Up to ``max_messages`` locked copies, waiting at most ``max_wait`` seconds."""
        ...

    async def peek(self, count: int) -> list[Any]:
        """Up to ``count`` messages without locking them, looping past short answers."""
        ...

    async def complete(self, message: Any) -> None: ...

    async def abandon(self, message: Any) -> None: ...

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
        """Move the copy to the entity's dead-letter queue with a reason and a description
        (None: without one, as the SDK's ``dead_letter_message`` takes them)."""
        ...

    async def defer(self, message: Any) -> None:
        """Defer the copy (it stays in the entity, retrievable by sequence number)."""
        ...

    async def renew_lock(self, message: Any) -> float | None:
        """Renew the copy's lock; return its new expiry (wall-clock seconds) if known."""
        ...

    async def close(self) -> None:
        """Close what this adapter created (never the caller's receiver)."""
        ...


@runtime_checkable
class SessionReceiver(RegionReceiver, Protocol):
    """One session locked in one region: a receiver of that session's messages only.

    ``renew_lock(message)`` renews the session's lock (a session's messages are locked as
    long as their session). :meth:`close` releases the session.
    """

    @property
    def session_id(self) -> str: ...

    async def has_messages(self) -> bool:
        """Whether the session holds a message a receive could take now, by browsing it
        (a receive can come back empty while the broker is slow to deliver)."""
        ...

    async def get_state(self) -> bytes | None:
        """The session's state in this region (None if none was set)."""
        ...

    async def set_state(self, state: bytes | None) -> None:
        """Set (None: clear) the session's state in this region."""
        ...


@runtime_checkable
class RegionSessions(RegionIdentity, Protocol):
    """One region's session-enabled queue or subscription: where sessions are accepted.

    Failed operations raise :class:`georep.exceptions.RegionError`.
    """

    async def accept(self, session_id: str | None, *, max_wait: float) -> SessionReceiver | None:
        """Lock a session: ``session_id``, or (None) the next one with messages.

        Returns None when no session became available within ``max_wait`` seconds, or
        the named session is locked by another receiver.
        """
        ...

    async def list_sessions(
        self, *, state_updated_after: datetime | None = None, timeout: float | None = None
    ) -> list[str]:
        """The ids of the sessions with messages or stored state, as the service lists
        them (only those whose state changed after ``state_updated_after``, if given), in
        ``timeout`` seconds at the most."""
        ...

    async def close(self) -> None:
        """Close what this adapter created (never the caller's client)."""
        ...
