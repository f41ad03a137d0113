"""The ports georep's core depends on; adapters implement them.

The core (``georep``) never imports a network client. It talks to Service Bus through
:class:`RegionSender` and :class:`MessageCodec`, persists unsent messages through
:class:`Outbox`, and reads time through :class:`Clock`. ``georep.adapters.servicebus``
implements the Service Bus ports on the azure-servicebus SDK; :class:`georep.SqliteOutbox`
is the embedded outbox; ``georep.testing`` has in-memory fakes of every port for unit tests.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol, runtime_checkable

from georep._slot import RegionSlot

__all__ = [
    "ClaimState",
    "Claims",
    "Clock",
    "Delivery",
    "ErrorKind",
    "Ledger",
    "MessageCodec",
    "OrderStamp",
    "Outbox",
    "OutboxEntry",
    "ReceiveRecord",
    "RegionAttempt",
    "RegionIdentity",
    "RegionReceiver",
    "RegionSender",
    "RegionSessions",
    "RegionSlot",
    "RelayEndpoint",
    "RelayRequest",
    "RelayResponse",
    "RoleRecord",
    "RoleStore",
    "SeenStore",
    "SendRecord",
    "SessionReceiver",
    "SessionStateStore",
]


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
class Clock(Protocol):
    """Time, injectable so unit tests never sleep for real."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (UTC)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...

    def deadline(self, seconds: float) -> AbstractContextManager[object]:
        """A ``with`` context that cancels its body after ``seconds`` (``TimeoutError``).

        Synchronous on purpose: it guards every send, where an await costs.
        """
        ...


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


class MessageCodec(Protocol):
    """How the core reads, copies, stores and batches the client library's messages."""

    def split(self, messages: Any) -> list[Any]:
        """The messages in ``messages``: a message, an iterable of messages, or a batch."""
        ...

    def is_batch(self, messages: Any) -> bool:
        """True when ``messages`` is a batch object (not a message or a list)."""
        ...

    def message_id(self, message: Any) -> str | None: ...

    def set_message_id(self, message: Any, message_id: str) -> None: ...

    def subject(self, message: Any) -> str | None: ...

    def session_id(self, message: Any) -> str | None:
        """The message's session id, if it has one (its order is then stamped)."""
        ...

    def application_property(self, message: Any, name: str) -> Any: ...

    def set_application_property(self, message: Any, name: str, value: str) -> None: ...

    def time_to_live(self, message: Any) -> float | None:
        """The message's time-to-live in seconds, or None when it has none."""
        ...

    def set_time_to_live(self, message: Any, seconds: float) -> None:
        """Set the message's time-to-live to ``seconds`` (positive)."""
        ...

    def copy(self, message: Any) -> Any:
        """An independent copy with the same body and properties (never the same object)."""
        ...

    def encode(self, message: Any) -> bytes:
        """Bytes that :meth:`decode` turns back into an equal message (for the outbox)."""
        ...

    def decode(self, payload: bytes) -> Any: ...

    def check(
        self, messages: Sequence[Any], *, one_partition: bool, max_size: int | None = None
    ) -> None:
        """Refuse, before anything is sent, what the service would refuse.

        SessionId and PartitionKey both set and different; with ``one_partition``, a list
        or batch whose messages carry different partition keys; identifiers, property
        types and body kinds the service (or a failover copy) cannot take; with
        ``max_size`` (bytes, the entity's limit when known), messages certainly over it.

        Raises:
            InvalidMessageError: naming the message and the fix.
        """
        ...

    def new_batch(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> Any:
        """An empty batch for the caller to fill; ``prepare`` runs on every added message."""
        ...


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One message waiting in the outbox.

    Attributes:
        entry_id: Assigned by the store, unique within it.
        channel: Which sender it belongs to (namespace pair and entity).
        region: The region it must reach, or None for whichever region accepts it.
        payload: The message, encoded by :meth:`MessageCodec.encode`.
        enqueued_at: Wall-clock seconds when it was stored.
        attempts: Failed delivery attempts so far.
    """

    entry_id: int
    channel: str
    region: str | None
    payload: bytes
    enqueued_at: float
    attempts: int


@runtime_checkable
class Outbox(Protocol):
    """A durable local queue of messages no region accepted yet (SPEC §2.3).

    Implementations persist every entry before :meth:`put` returns, and delete it only
    when told to (after a region accepted it), so nothing acknowledged is lost. An entry
    that can never be sent leaves the queue through :meth:`dead_letter` and is kept aside.

    Claims carry an ``owner`` (one per drainer): :meth:`renew`, :meth:`release` and
    :meth:`retry_later` given an owner only touch entries that owner still holds, so a
    drainer whose lease ran out never disturbs the drainer that took the entry over.
    """

    async def put(
        self, channel: str, items: Sequence[tuple[str | None, bytes]], *, now: float
    ) -> list[int]:
        """Store ``(region, payload)`` items atomically; return their entry ids.

        Raises:
            OutboxFullError: Storing them would exceed the outbox's bound (or its disk is
                full); none is stored.
        """
        ...

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float, owner: str | None = None
    ) -> list[OutboxEntry]:
        """Up to ``limit`` entries of ``channel`` that are due and not leased, oldest first.

        They stay leased to ``owner`` for ``lease`` seconds, so a second drainer (in this
        process or another) does not send them at the same time.
        """
        ...

    async def renew(
        self, entry_ids: Sequence[int], *, owner: str, now: float, lease: float
    ) -> list[int]:
        """Extend ``owner``'s leases to ``now + lease``; return the ids it still holds."""
        ...

    async def release(self, entry_ids: Sequence[int], *, owner: str | None = None) -> None:
        """Hand leased entries back unsent: due again at once, no attempt counted."""
        ...

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries."""
        ...

    async def retry_later(
        self, entry_ids: Sequence[int], *, not_before: float, owner: str | None = None
    ) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``."""
        ...

    async def dead_letter(self, entries: Sequence[tuple[int, str]], *, now: float) -> None:
        """Move ``(entry_id, reason)`` entries out of the queue into the dead-letter store.

        ``reason`` names the error's class and kind, never its text (it may hold a secret).
        """
        ...

    async def depth(self, channel: str | None = None) -> int:
        """Entries queued (for ``channel``, or in total); dead-lettered ones not included."""
        ...

    async def aclose(self) -> None:
        """Release the store; idempotent."""
        ...


class ClaimState(enum.StrEnum):
    """What :meth:`SeenStore.claim` found for one dedup key, and the outcomes it records."""

    CLAIMED = "claimed"
    """Ours now: process the message, then commit (or release on failure)."""
    IN_FLIGHT = "in-flight"
    """Another consumer holds a live claim: wait for its outcome."""
    DONE = "done"
    """Processed already (within the dedup window): settle the copy without processing."""
    DEAD_LETTERED = "dead-lettered"
    """Dead-lettered already (by a handler, or after ``max_attempts``): dead-letter this copy
    too, never process it. The recorded reason is in :attr:`Claims.reasons`."""
    DEFERRED = "deferred"
    """Deferred already by a handler: defer this copy too, never process it."""


FINAL_STATES: tuple[ClaimState, ...] = (
    ClaimState.DONE,
    ClaimState.DEAD_LETTERED,
    ClaimState.DEFERRED,
)
"""The outcomes :meth:`SeenStore.commit` records (the others are claim answers only)."""


class Claims(list[ClaimState]):
    """What :meth:`SeenStore.claim` returns: the states in key order, plus reasons.

    A plain list of :class:`ClaimState` (compares equal to one), with the reason each
    :attr:`ClaimState.DEAD_LETTERED` key was committed with, read in the same round trip.

    Attributes:
        reasons: Index in the key list -> the dead-letter reason recorded for that key.
    """

    __slots__ = ("reasons",)

    def __init__(
        self, states: Sequence[ClaimState] = (), reasons: dict[int, str] | None = None
    ) -> None:
        super().__init__(states)
        self.reasons: dict[int, str] = reasons if reasons is not None else {}


@runtime_checkable
class SeenStore(Protocol):
    """The shared record of which logical messages were processed (SPEC §2.4).

    Claim -> process -> commit: a key is marked done only after its handler succeeded. A
    claim is a lease: if its holder dies, the lease expires and the key can be claimed
    again. Every method takes many keys and costs one round trip to the store.

    Implementations raise :class:`georep.exceptions.StoreUnavailableError` when the store
    cannot be reached, and nothing else for that condition.
    """

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        """Try to claim each key for ``owner`` for ``lease`` seconds.

        A key already claimed by the same ``owner`` is claimed again (lease renewed).
        Implementations return a :class:`Claims` so that dead-letter reasons come back in
        the same round trip; a plain list means "no reasons known".
        """
        ...

    async def commit(
        self,
        keys: Sequence[str],
        *,
        owner: str,
        outcome: ClaimState = ClaimState.DONE,
        reasons: Sequence[str] | None = None,
    ) -> None:
        """Record the keys' final outcome for the store's dedup window (whoever holds them).

        Args:
            keys: The dedup keys.
            owner: The committing consumer.
            outcome: One of :data:`FINAL_STATES`. Default ``DONE`` (processed).
            reasons: For ``DEAD_LETTERED``: one reason per key, returned to later claims.

        Raises:
            ConfigurationError: ``outcome`` is not a final state, or ``reasons`` does not
                have one entry per key.
        """
        ...

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims (the handler failed); others' claims are untouched."""
        ...

    async def peek(self, keys: Sequence[str]) -> list[ClaimState | None]:
        """The keys' states without claiming them: IN_FLIGHT (claimed by anyone), a final
        state, or None (no entry). Session order reads its predecessors' states with it."""
        ...

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` more seconds; False where it lost them."""
        ...

    async def aclose(self) -> None:
        """Release connections this store created; idempotent."""
        ...


@runtime_checkable
class SessionStateStore(Protocol):
    """Where a GeoReceiver in session mode keeps session state (docs/sessions.md §3).

    Both regions' receivers read and write one value per session, so the state survives a
    failover. ``RedisSeenSet`` and ``InMemorySeenSet`` implement it beside the seen-set.
    Failures raise :class:`georep.exceptions.StoreUnavailableError`.
    """

    async def get_session_state(self, key: str) -> bytes | None: ...

    async def set_session_state(self, key: str, state: bytes | None) -> None: ...


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

    async def dead_letter(self, message: Any, reason: str, description: str) -> None:
        """Move the copy to the entity's dead-letter queue with a reason."""
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

    async def close(self) -> None:
        """Close what this adapter created (never the caller's client)."""
        ...


# ----------------------------------------------------------------------------- ledger
# Records are NamedTuples, not dataclasses: one is built per send or received copy, and a
# tuple is the cheapest immutable object to build on that path.


class RegionAttempt(NamedTuple):
    """What one region did with a send (the ``regions`` column of the ledger).

    Attributes:
        region: The region's label; None for a copy queued for "whichever region accepts"
            (the passive outbox).
        outcome: One of ``georep._ledger_schema.REGION_OUTCOMES``.
        error: The exception's class name when the region failed or was skipped.
    """

    region: str | None
    outcome: str
    error: str | None = None


class SendRecord(NamedTuple):
    """One ``send_messages`` call; the ledger writes one row per message id.

    Times are wall-clock seconds since the epoch (``Clock.time()``).
    """

    message_ids: Sequence[str]
    entity: str
    mode: str
    outcome: str
    accepted_region: str | None
    failover: bool
    regions: Sequence[RegionAttempt]
    started_at: float
    finished_at: float


class ReceiveRecord(NamedTuple):
    """One copy a receiver got from a region, and what became of it.

    Times are wall-clock seconds since the epoch; ``enqueued_at`` is the broker's.
    """

    message_id: str
    entity: str
    region: str
    outcome: str
    delivery_count: int
    enqueued_at: float | None
    received_at: float
    settled_at: float | None
    session_id: str | None = None
    """The copy's session id, if any."""
    order_writer: str | None = None
    """Its ``georep.order.writer`` stamp, if any."""
    order_seq: int | None = None
    """Its ``georep.order.seq`` stamp (its number in the session, per writer), if any."""
    order_gap: str | None = None
    """Session mode: why it was handed on without its predecessor (``timeout``: order_wait
    ran out; ``absent``: no region held it), or None."""
    order_wait: float = 0.0
    """Session mode: seconds it waited for its predecessor."""
    finished_at: float | None = None
    """When the handler returned (a copy settled without the handler: when the receiver was
    done with it, its outcome recorded), settled or not."""


@runtime_checkable
class Ledger(Protocol):
    """Where senders and receivers record what happened to each message (SPEC §6).

    ``record_*`` are called on the event loop's thread, on every send and settled copy: they
    must be cheap, synchronous and never block or raise (a full buffer drops and counts).
    Senders and receivers :meth:`flush` a ledger they were given when they close; the
    caller owns it and closes it. :class:`georep.ParquetLedger` writes Parquet files;
    ``georep.testing.InMemoryLedger`` keeps rows in lists.
    """

    def record_send(self, record: SendRecord) -> None:
        """Buffer one send call (one row per message id)."""
        ...

    def record_receive(self, record: ReceiveRecord) -> None:
        """Buffer one received copy."""
        ...

    async def flush(self) -> None:
        """Write everything buffered so far."""
        ...

    async def aclose(self) -> None:
        """Flush and stop. Idempotent."""


@dataclass(frozen=True, slots=True)
class RelayRequest:
    """One HTTP-style request as a relay listener's handler receives it.

    Attributes:
        method: HTTP method, upper case (``"GET"``, ``"POST"``...).
        target: Path and query below the endpoint, starting with ``/`` (``"/orders?id=7"``).
        headers: Request headers (names as sent).
        body: The request body (empty when there is none).
    """

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class RelayResponse:
    """A service's answer, as a relay endpoint returns it (any status the service chose).

    Attributes:
        status: HTTP status code. A 4xx/5xx from the service itself is a normal answer:
            only relay-level failures raise.
        headers: Response headers.
        body: Response body.
        region: Label of the endpoint that answered (``"primary"``...); empty when built
            by a handler.
    """

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    region: str = ""


@runtime_checkable
class RelayEndpoint(Protocol):
    """One endpoint of a service reachable through a relay (or plain HTTP).

    ``request`` returns every answer the service gave, whatever its status. A failure that
    says the endpoint is unavailable (connection refused or lost, timeout, relay handshake
    refused, no listener, gateway errors, websocket closed 1001/1008/1011) raises
    :class:`georep.exceptions.RegionError` with an :class:`ErrorKind`; the
    :class:`georep.FailoverChannel` decides by kind whether to try the other endpoint.
    """

    @property
    def region(self) -> str:
        """The endpoint's label in results, errors and telemetry (``"primary"``)."""
        ...

    @property
    def address(self) -> str:
        """Where requests go (no secrets), e.g. ``https://ns.servicebus.windows.net/svc``."""
        ...

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
    ) -> RelayResponse:
        """Send one request and return the service's answer within ``timeout`` seconds."""
        ...

    async def close(self) -> None:
        """Close the connections this endpoint opened (idempotent)."""
        ...


@dataclass(frozen=True, slots=True)
class RoleRecord:
    """The shared roles of one entity: which region is active, and who said so.

    Attributes:
        active: The active region's label (``"primary"`` or ``"secondary"``).
        generation: Bumped by every change of ``active`` (never by a pin or unpin).
        since: Wall-clock seconds (Unix epoch) when ``active`` last changed, or when the
            record was created.
        pinned: No automatic swap while set: only an operator moves the roles.
        automatic: The last change of ``active`` was georep's own (a failover or a
            failback), not an operator's. Automatic failback undoes only those.
        changed_by: Who made the last change: ``user@host pid N (what)``.
        mode: How the senders that created the record replicate: ``"active"`` (every
            message to both regions: no region is active, so an operator's failover
            changes nothing they do), ``"passive"``, or ``""`` when not known (a
            PairedSender's or FailoverChannel's record, an operator's, or one written
            before georep recorded the mode). Set when the record is created; a change
            keeps it.
    """

    active: str
    generation: int = 0
    since: float = 0.0
    pinned: bool = False
    automatic: bool = True
    changed_by: str = ""
    mode: str = ""


@runtime_checkable
class RoleStore(Protocol):
    """Roles shared by every process of one application, one record per entity.

    A change is a compare-and-set on the generation: however many processes race to swap
    from the same generation, one wins and the others get the winner's record. Every
    method raises :class:`georep.exceptions.StoreUnavailableError` when the store cannot
    be reached or does not answer within its operation timeout, and nothing else for that.
    """

    async def read(self, entity: str) -> RoleRecord | None:
        """The entity's record, or None when no process created one yet."""
        ...

    async def create(self, entity: str, record: RoleRecord) -> RoleRecord:
        """Store ``record`` unless the entity has one; return the stored record."""
        ...

    async def change(
        self,
        entity: str,
        *,
        expected_generation: int,
        active: str,
        changed_by: str,
        now: float,
        automatic: bool = True,
        pinned: bool | None = None,
    ) -> tuple[bool, RoleRecord]:
        """Make ``active`` active if the generation is still ``expected_generation``.

        The generation is bumped (and ``since`` set to ``now``) only when ``active``
        differs from the stored one; ``pinned`` (None: unchanged) is set either way. An
        ``automatic`` change of a pinned record is refused.

        Returns:
            (True, the new record), or (False, the stored record) when the generation
            had moved on, the record is pinned against an automatic change, or the
            entity has no record.
        """
        ...

    async def entities(self) -> list[str]:
        """The entities that have a record, sorted."""
        ...

    async def delete(self, entity: str) -> bool:
        """Remove the entity's record (and the entity from :meth:`entities`) atomically.

        A process still sharing the entity's roles creates the record again from its own
        roles at its next read of the store (``georep forget``).

        Returns:
            True if there was a record, False if there was none.
        """
        ...

    async def report_failure(
        self,
        entity: str,
        *,
        region: str,
        generation: int,
        reporter: str,
        now: float,
        window: float,
    ) -> int:
        """Record that ``reporter`` (one process) saw ``region`` fail while ``generation``
        was the entity's generation, at wall-clock ``now``; return how many distinct
        reporters did so within the last ``window`` seconds, this one included.

        Only needed for ``Corroboration(reports=N)`` with N > 1; reports are kept about
        ``window`` seconds, apart from the record.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store opened (idempotent)."""
        ...
