"""The emulator's broker: entities, messages, locks and timers, with no I/O.

One :class:`Namespace` per emulated region. Everything here is driven by explicit calls
and an injected clock, so it is tested without a network or real sleeps; the AMQP layer
(`_amqp.py`) calls into it and implements :class:`Consumer` for receiver links. What it
builds on sits below it: the stored message (`_message.py`), its error (`_errors.py`),
subscription rules (`_rules.py`) and sessions (`_sessions.py`, which sees an entity
through a Protocol); those never import this module.

Dispatch cost: each entity keeps its available messages in a deque and its consumers
with credit in a ring; a new message or a credit grant touches only the head of each, so
nothing rescans a queue per credit or per delivery.
"""

from __future__ import annotations

__all__ = [
    "MAX_MESSAGE_SIZE",
    "MAX_PARTITIONED_ENTITIES",
    "PARTITIONED_SIZES_MB",
    "PARTITION_COUNT",
    "PING_CONTENT_TYPE",
    "BrokerError",
    "Consumer",
    "Entity",
    "EntityProperties",
    "MessageState",
    "Namespace",
    "StoredMessage",
    "SubscriptionProperties",
    "TimerTarget",
    "Topic",
]

import contextlib
import heapq
import itertools
import time
import uuid
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Protocol

from ._codec import (
    SECTION_APPLICATION_PROPERTIES,
    decode_value,
    encode_map_entries,
    encode_map_section,
    is_batch,
    map_entries,
    parse_message,
    section_value_start,
    skip_value,
    split_sections,
)
from ._errors import BrokerError
from ._message import MessageState, StoredMessage
from ._rules import RuleSet, StoredMessageContext
from ._sessions import Sessions

# Service Bus Standard tier: 256 KB per message.
MAX_MESSAGE_SIZE = 256 * 1024
# Standard tier partitioning: 16 fragments, sizes of 1-5 GB each, 100 partitioned entities.
PARTITION_COUNT = 16
PARTITIONED_SIZES_MB = (1024, 2048, 3072, 4096, 5120)
MAX_PARTITIONED_ENTITIES = 100
# A peek of a partitioned entity returns at most this many bytes (but always one message).
_PEEK_AGGREGATE_BYTES = 256 * 1024
_MAX_TIMESPAN = timedelta(days=10675199, seconds=10085, microseconds=477580)


def not_found(path: str) -> BrokerError:
    return BrokerError(
        "amqp:not-found",
        f"The messaging entity '{path}' could not be found. Create it first "
        "(Emulator(queues=...), the admin client, or `georep emulator --queue`).",
    )


@dataclass(frozen=True, kw_only=True)
class EntityProperties:
    """Settings of a queue or topic (the names follow the SDK's ``QueueProperties``).

    Times are :class:`datetime.timedelta`.
    """

    lock_duration: timedelta = timedelta(seconds=60)
    max_delivery_count: int = 10
    default_message_time_to_live: timedelta = _MAX_TIMESPAN
    dead_lettering_on_message_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    requires_session: bool = False
    enable_partitioning: bool = False
    enable_batched_operations: bool = True
    max_size_in_megabytes: int = 1024
    max_message_size_in_kilobytes: int = 256
    auto_delete_on_idle: timedelta = _MAX_TIMESPAN
    status: str = "Active"
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None
    enable_express: bool = False
    # Topics only, kept here so one type describes every sendable entity.
    support_ordering: bool = True
    filtering_messages_before_publishing: bool = False


@dataclass(frozen=True, kw_only=True)
class SubscriptionProperties:
    """Settings of a topic subscription (the SDK's ``SubscriptionProperties`` names)."""

    lock_duration: timedelta = timedelta(seconds=60)
    max_delivery_count: int = 10
    default_message_time_to_live: timedelta = _MAX_TIMESPAN
    dead_lettering_on_message_expiration: bool = False
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    requires_session: bool = False
    enable_batched_operations: bool = True
    auto_delete_on_idle: timedelta = _MAX_TIMESPAN
    status: str = "Active"
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None


class Consumer(Protocol):
    """A receiver link as the broker sees it (implemented by the AMQP layer)."""

    receive_and_delete: bool

    @property
    def credit(self) -> int:
        """How many more messages the link may take now."""

    def deliver(self, message: StoredMessage, lock_token: uuid.UUID | None) -> None:
        """Transfer ``message`` (already locked or removed by the broker)."""


class TimerTarget(Protocol):
    """What a timer on the namespace's heap calls when it is due (an entity, or the
    sessions of one: :class:`~._sessions.Sessions`)."""

    def on_timer(self, kind: int, payload: Any, now: float) -> None:
        """``kind`` is the target's own; ``payload`` what it gave :meth:`Namespace.add_timer`."""


# An entity's timer kinds (a message's lock, its time to live, its scheduled time).
_LOCK, _TTL, _SCHEDULE = 0, 1, 2


class Entity:
    """A queue, a topic subscription, or a dead-letter sub-queue: something receivers read."""

    def __init__(
        self,
        namespace: Namespace,
        path: str,
        properties: EntityProperties | SubscriptionProperties,
        *,
        is_dead_letter: bool = False,
        fragments_down: set[int] | None = None,
        partitioned: bool | None = None,
    ) -> None:
        self.namespace = namespace
        self.path = path
        self.properties = properties
        self.is_dead_letter = is_dead_letter
        # Partitioning belongs to the queue or topic: subscriptions and dead-letter queues
        # share their parent's flag and its set of fragments that are down (one set object).
        self.partitioned = (
            bool(getattr(properties, "enable_partitioning", False))
            if partitioned is None
            else partitioned
        )
        self.fragments_down: set[int] = fragments_down if fragments_down is not None else set()
        # Messages of down fragments met by dispatch wait here, per fragment, in order.
        self._held: dict[int, deque[StoredMessage]] = {}
        self.available: deque[StoredMessage] = deque()
        self._dead_in_available = 0
        self.locked: dict[uuid.UUID, StoredMessage] = {}
        self.deferred: dict[int, StoredMessage] = {}
        self.scheduled: dict[int, StoredMessage] = {}
        self.by_sequence: dict[int, StoredMessage] = {}
        self.consumers: deque[Consumer] = deque()
        self.dead_letter: Entity | None = (
            None
            if is_dead_letter
            else Entity(
                namespace,
                f"{path}/$DeadLetterQueue",
                properties,
                is_dead_letter=True,
                fragments_down=self.fragments_down,
                partitioned=self.partitioned,
            )
        )
        self.size_in_bytes = 0
        self.created_at = namespace.clock()
        self.updated_at = self.created_at
        self.accessed_at = self.created_at
        # Session-enabled: available messages live per session (_sessions.py). Never the
        # dead-letter queue, which the service does not make session-enabled.
        self.sessions: Sessions | None = None
        if properties.requires_session and not is_dead_letter:
            self.sessions = Sessions(self)

    # -- counts -------------------------------------------------------------------
    @property
    def active_count(self) -> int:
        # Service Bus counts locked and deferred messages as active; scheduled ones are not.
        return len(self.by_sequence) - len(self.scheduled)

    @property
    def message_count(self) -> int:
        dead = self.dead_letter.message_count if self.dead_letter else 0
        return len(self.by_sequence) + dead

    def runtime(self) -> dict[str, Any]:
        """Runtime counters, as the admin client reports them."""
        return {
            "active_message_count": self.active_count,
            "dead_letter_message_count": len(self.dead_letter.by_sequence)
            if self.dead_letter
            else 0,
            "scheduled_message_count": len(self.scheduled),
            "transfer_message_count": 0,
            "transfer_dead_letter_message_count": 0,
            "total_message_count": self.message_count,
            "size_in_bytes": self.size_in_bytes,
            "created_at_utc": self.created_at,
            "updated_at_utc": self.updated_at,
            "accessed_at_utc": self.accessed_at,
        }

    # -- enqueue -------------------------------------------------------------------
    def enqueue(self, message: StoredMessage) -> None:
        """Add a message (a fresh copy owned by this entity) and dispatch it if possible."""
        self.by_sequence[message.sequence_number] = message
        self.size_in_bytes += message.size
        now = self.namespace.clock()
        if message.expires_at is not None:
            self.namespace.add_timer(message.expires_at, _TTL, self, message)
        if message.scheduled_at is not None and message.scheduled_at > now:
            message.state = MessageState.SCHEDULED
            self.scheduled[message.sequence_number] = message
            self.namespace.add_timer(message.scheduled_at, _SCHEDULE, self, message)
            return
        if self.sessions is not None and message.session_id is None:
            # Reached through a topic (a queue refuses the send): the service dead-letters it.
            # GONE: it never became available, so _remove has no queue to take it from.
            message.state = MessageState.GONE
            self.dead_letter_message(
                message,
                "Session id is null.",
                "Session enabled entity doesn't allow a message whose session identifier is null.",
            )
            return
        self._make_available(message)

    def _make_available(self, message: StoredMessage, *, front: bool = False) -> None:
        """``message`` may be delivered: queue it (at the head when it returns) and dispatch."""
        message.state = MessageState.AVAILABLE
        if self.sessions is not None:
            self.sessions.add(message, front=front)
            return
        if front:
            self.available.appendleft(message)
        else:
            self.available.append(message)
        self.dispatch()

    def _remove(self, message: StoredMessage) -> None:
        if self.by_sequence.pop(message.sequence_number, None) is not None:
            self.size_in_bytes -= message.size
        if self.sessions is not None:
            self.sessions.forget(message)
        if message.state is MessageState.LOCKED and message.lock_token is not None:
            self.locked.pop(message.lock_token, None)
        elif message.state is MessageState.DEFERRED:
            self.deferred.pop(message.sequence_number, None)
            if message.lock_token is not None:
                self.locked.pop(message.lock_token, None)
        elif message.state is MessageState.SCHEDULED:
            self.scheduled.pop(message.sequence_number, None)
        elif message.state is MessageState.AVAILABLE:
            # Left in the deque and skipped lazily (see _compact).
            self._dead_in_available += 1
        message.state = MessageState.GONE
        message.lock_token = None

    # -- dispatch -----------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        with contextlib.suppress(ValueError):
            self.consumers.remove(consumer)

    def dispatch(self) -> None:
        """Hand available messages to consumers with credit, round-robin."""
        if self.sessions is not None:
            self.sessions.dispatch()
            return
        consumers = self.consumers
        available = self.available
        if not consumers or not available:
            return
        clock = self.namespace.clock
        idle = 0
        while available and idle < len(consumers):
            consumer = consumers[0]
            if consumer.credit <= 0:
                consumers.rotate(-1)
                idle += 1
                continue
            message = available.popleft()
            if message.state is not MessageState.AVAILABLE:
                self._dead_in_available = max(0, self._dead_in_available - 1)
                continue
            if message.fragment is not None and message.fragment in self.fragments_down:
                # Its fragment is unavailable: hold it until fragment_up, keep going.
                self._held.setdefault(message.fragment, deque()).append(message)
                continue
            now = clock()
            if message.expires_at is not None and message.expires_at <= now:
                self.expire(message)
                continue
            idle = 0
            self.hand_over(consumer, message, now)
            consumers.rotate(-1)

    def hand_over(self, consumer: Consumer, message: StoredMessage, now: float) -> None:
        """Deliver ``message``: removed (receive-and-delete) or locked (peek-lock)."""
        self.accessed_at = now
        if consumer.receive_and_delete:
            self._remove(message)
            consumer.deliver(message, None)
        else:
            consumer.deliver(message, self._lock(message, now))

    def fragment_restored(self, index: int) -> None:
        """The fragment ``index`` is up again: its held messages go first, then dispatch."""
        held = self._held.pop(index, None)
        if held and self.sessions is None:
            self.available.extendleft(
                reversed([m for m in held if m.state is MessageState.AVAILABLE])
            )
        self.dispatch()

    def _lock(self, message: StoredMessage, now: float) -> uuid.UUID:
        token = uuid.uuid4()
        message.state = MessageState.LOCKED
        message.lock_token = token
        self.locked[token] = message
        if self.sessions is not None:
            # Locked for as long as its session is; the session's timer ends both.
            message.locked_until = self.sessions.lock_message(message)
            return token
        message.locked_until = now + self.properties.lock_duration.total_seconds()
        self.namespace.add_timer(message.locked_until, _LOCK, self, message)
        return token

    # -- settlement -------------------------------------------------------------------
    def _locked_message(self, token: uuid.UUID) -> StoredMessage:
        message = self.locked.get(token)
        if self.sessions is not None:
            # A session's locks end with it: an unknown token is a lost session lock.
            self.sessions.check_lock(message)
        if message is None or message.locked_until <= self.namespace.clock():
            raise BrokerError(
                "com.microsoft:message-lock-lost",
                "The lock supplied is invalid: it expired, or the message was already settled "
                "or received by another receiver.",
            )
        return message

    def complete(self, token: uuid.UUID) -> None:
        self._remove(self._locked_message(token))

    def abandon(self, token: uuid.UUID) -> None:
        """The application gave the message up: a failed delivery, counted."""
        self._release(self._locked_message(token))

    def release(self, token: uuid.UUID) -> None:
        """The client hands the message back unseen (AMQP ``released``, or ``modified``
        without delivery-failed): the SDK does this to messages that reach its buffer
        outside a receive call. Not a delivery attempt, so not counted, as on Azure."""
        self._release(self._locked_message(token), failed=False)

    def session_ended(self, message: StoredMessage) -> None:
        """Return a locked message whose session lock ended (see _sessions.py): counted, as
        a lock expiry is."""
        self._release(message)

    def _release(self, message: StoredMessage, *, failed: bool = True) -> None:
        """Return a locked message; ``failed`` (abandon, lock expiry) counts a delivery."""
        if self.sessions is not None:
            self.sessions.forget(message)
        self.locked.pop(message.lock_token, None)  # type: ignore[arg-type]
        message.lock_token = None
        if failed:
            message.delivery_count += 1
        if message.sequence_number in self.deferred:
            message.state = MessageState.DEFERRED
            return
        if (
            failed
            and message.delivery_count >= self.properties.max_delivery_count
            and not self.is_dead_letter
        ):
            message.state = MessageState.LOCKED  # so _remove drops it from the right place
            self.dead_letter_message(
                message,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {self.properties.max_delivery_count} "
                "delivery attempts.",
            )
            return
        # Back to the head: the next receiver sees it first, as it was the oldest.
        self._make_available(message, front=True)

    def defer(self, token: uuid.UUID) -> None:
        message = self._locked_message(token)
        if self.sessions is not None:
            self.sessions.forget(message)
        self.locked.pop(token, None)
        message.lock_token = None
        message.state = MessageState.DEFERRED
        self.deferred[message.sequence_number] = message

    def dead_letter_by_token(
        self, token: uuid.UUID, reason: str | None, description: str | None
    ) -> None:
        self.dead_letter_message(self._locked_message(token), reason, description)

    def dead_letter_message(
        self, message: StoredMessage, reason: str | None, description: str | None
    ) -> None:
        """Move ``message`` to this entity's dead-letter sub-queue with reason and description."""
        self._remove(message)
        if self.dead_letter is None:  # already in a DLQ: dead-lettering again just drops it
            return
        properties: dict[str, Any] = {}
        if reason is not None:
            properties["DeadLetterReason"] = reason
        if description is not None:
            properties["DeadLetterErrorDescription"] = description
        copy = replace(
            message,
            bare=_with_application_properties(message.bare, properties),
            state=MessageState.AVAILABLE,
            lock_token=None,
            expires_at=None,
            scheduled_at=None,
            dead_letter_source=self.path,
        )
        self.dead_letter.enqueue(copy)

    def expire(self, message: StoredMessage) -> None:
        """TTL reached: dead-letter when the entity says so, else drop."""
        if message.state is MessageState.GONE:
            return
        if self.properties.dead_lettering_on_message_expiration and not self.is_dead_letter:
            self.dead_letter_message(
                message, "TTLExpiredException", "The message expired and was dead lettered."
            )
        else:
            self._remove(message)

    def renew_lock(self, token: uuid.UUID) -> float:
        message = self._locked_message(token)
        message.locked_until = (
            self.namespace.clock() + self.properties.lock_duration.total_seconds()
        )
        self.namespace.add_timer(message.locked_until, _LOCK, self, message)
        return message.locked_until

    # -- management -----------------------------------------------------------------
    def peek(
        self, from_sequence: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Messages with sequence number >= ``from_sequence``, any state, oldest first
        (only those of ``session_id`` when given: a session receiver peeks its session).

        A partitioned entity answers from one fragment at a time, like the service: the
        answer stops at the end of the first message's fragment run (the next message in
        sequence order lives in another fragment) or once it holds 256 KB, so a caller
        wanting ``count`` messages must peek again from the last sequence number + 1.
        """
        result = [
            m
            for seq, m in sorted(self.by_sequence.items())
            if seq >= from_sequence and (session_id is None or m.session_id == session_id)
        ]
        if not self.partitioned or not result:
            return result[:count]
        fragment = result[0].fragment
        run: list[StoredMessage] = []
        size = 0
        for message in result[:count]:
            if message.fragment != fragment:
                break
            size += message.size
            if run and size > _PEEK_AGGREGATE_BYTES:
                break
            run.append(message)
        return run

    def cancel_scheduled(self, sequence_numbers: list[int]) -> list[int]:
        """Remove the scheduled messages with these numbers; the numbers none has (never
        scheduled here, cancelled already, or enqueued since)."""
        missing = []
        for seq in sequence_numbers:
            message = self.scheduled.get(seq)
            if message is not None:
                self._remove(message)
            else:
                missing.append(seq)
        return missing

    def receive_deferred(
        self, sequence_numbers: list[int], receive_and_delete: bool, session_id: str | None = None
    ) -> list[tuple[StoredMessage, uuid.UUID | None]]:
        """Lock (or remove) deferred messages by sequence number (of ``session_id`` only,
        locked for as long as that session, when the entity is session-enabled)."""
        now = self.namespace.clock()
        result: list[tuple[StoredMessage, uuid.UUID | None]] = []
        for seq in sequence_numbers:
            message = self.deferred.get(seq)
            if self.sessions is not None and message and message.session_id != session_id:
                message = None  # another session's: not visible to this receiver
            if message is None:
                raise BrokerError(
                    "com.microsoft:message-not-found",
                    f"No deferred message with sequence number {seq} in '{self.path}'.",
                )
            if receive_and_delete:
                self._remove(message)
                result.append((message, None))
                continue
            token = uuid.uuid4()
            if message.lock_token is not None:
                self.locked.pop(message.lock_token, None)
            message.lock_token = token
            self.locked[token] = message
            if self.sessions is not None:
                message.locked_until = self.sessions.lock_message(message)
            else:
                message.locked_until = now + self.properties.lock_duration.total_seconds()
                self.namespace.add_timer(message.locked_until, _LOCK, self, message)
            result.append((message, token))
        return result

    def on_timer(self, kind: int, payload: Any, now: float) -> None:
        message: StoredMessage = payload
        if message.state is MessageState.GONE:
            return
        if kind == _LOCK:
            if message.lock_token is not None and message.locked_until <= now:
                if message.state is MessageState.DEFERRED:
                    self.locked.pop(message.lock_token, None)
                    message.lock_token = None
                else:
                    self._release(message)
        elif kind == _TTL:
            if (
                message.expires_at is not None
                and message.expires_at <= now
                and message.state is not MessageState.LOCKED
            ):
                self.expire(message)
                self._compact()
        elif kind == _SCHEDULE and message.state is MessageState.SCHEDULED:
            self.scheduled.pop(message.sequence_number, None)
            message.enqueued_at = now
            self._make_available(message)

    def _compact(self) -> None:
        """Drop dead entries from the available deque once they dominate it.

        Messages that expire unread would otherwise pile up. Never called from
        :meth:`dispatch`, which holds the deque while it works.
        """
        if self._dead_in_available > 1024 and self._dead_in_available * 2 > len(self.available):
            self.available = deque(m for m in self.available if m.state is MessageState.AVAILABLE)
            self._dead_in_available = 0

    def purge(self) -> None:
        for message in list(self.by_sequence.values()):
            message.state = MessageState.GONE
        self.available.clear()
        self._held.clear()
        self._dead_in_available = 0
        self.locked.clear()
        self.deferred.clear()
        self.scheduled.clear()
        self.by_sequence.clear()
        self.size_in_bytes = 0
        if self.sessions is not None:
            self.sessions.clear()
        if self.dead_letter is not None:
            self.dead_letter.purge()


def _with_application_properties(
    bare: bytes, extra: Mapping[str, Any], drop: frozenset[str] = frozenset()
) -> bytes:
    """Return ``bare`` with ``extra`` merged into its application properties, ``drop`` removed."""
    if not extra and not drop:
        return bare
    entries = b""
    count = 0
    before, after = bare, b""
    for code, start, end in split_sections(bare):
        if code == SECTION_APPLICATION_PROPERTIES:
            entries, count = map_entries(bare, section_value_start(bare, start))
            before, after = bare[:start], bare[end:]
            break
        if code > SECTION_APPLICATION_PROPERTIES:
            before, after = bare[:start], bare[start:]
            break
    merged, merged_count = _merge_entries(entries, count, extra, drop)
    return before + encode_map_section(SECTION_APPLICATION_PROPERTIES, merged, merged_count) + after


def _merge_entries(
    entries: bytes, count: int, extra: Mapping[str, Any], drop: frozenset[str]
) -> tuple[bytes, int]:
    """Map entries with ``extra`` replacing any earlier values of the same keys, less ``drop``."""
    out = bytearray()
    kept = 0
    pos = 0
    for _ in range(count // 2):
        key_start = pos
        key, pos = decode_value(entries, pos)
        pos = skip_value(entries, pos)
        if key not in extra and key not in drop:
            out += entries[key_start:pos]
            kept += 2
    out += encode_map_entries({k: v for k, v in extra.items()})
    return bytes(out), kept + len(extra) * 2


@dataclass(eq=False)
class Topic:
    """A topic: fans each message out to its subscriptions."""

    path: str
    properties: EntityProperties
    subscriptions: dict[str, Entity] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    size_in_bytes: int = 0
    fragments_down: set[int] = field(default_factory=set)
    """Fragments that are down (partitioned topics), shared with every subscription."""
    rules: dict[str, RuleSet] = field(default_factory=dict)
    """Each subscription's rules, by subscription name (see ``_rules``)."""

    @property
    def partitioned(self) -> bool:
        return self.properties.enable_partitioning


class DuplicateDetector:
    """Remembers MessageIds for a history window; repeated ids inside it are dropped."""

    def __init__(self) -> None:
        self._seen: OrderedDict[Any, float] = OrderedDict()

    def is_duplicate(self, message_id: Any, now: float, window: float) -> bool:
        seen = self._seen
        while seen:
            at = next(iter(seen.values()))
            if at + window > now:
                break
            seen.popitem(last=False)
        if message_id is None:
            return False
        if message_id in seen:
            return True
        seen[message_id] = now
        return False


class Namespace:
    """One emulated Service Bus namespace (a region).

    Args:
        name: namespace name, e.g. ``"primary"``.
        clock: seconds since the epoch; injectable for tests.
        on_timer_change: called with the earliest pending deadline whenever it moves
            earlier, so the event loop can arm a single timer.
    """

    def __init__(
        self,
        name: str,
        *,
        clock: Callable[[], float] = time.time,
        on_timer_change: Callable[[float], None] | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.queues: dict[str, Entity] = {}
        self.topics: dict[str, Topic] = {}
        # Keyed by entity path, or (path, fragment) for partitioned entities.
        self._dedup: dict[Any, DuplicateDetector] = {}
        self._round_robin: dict[str, int] = {}
        self._sequence = itertools.count(1)
        self._timers: list[tuple[float, int, int, TimerTarget, Any]] = []
        self._timer_ids = itertools.count()
        self._on_timer_change = on_timer_change

    # -- entities ---------------------------------------------------------------------
    def create_queue(self, path: str, properties: EntityProperties | None = None) -> Entity:
        properties = properties or EntityProperties()
        self._check_free(path)
        self._check_partitioning(path, properties)
        entity = Entity(self, path, properties)
        self.queues[path] = entity
        return entity

    def create_topic(self, path: str, properties: EntityProperties | None = None) -> Topic:
        properties = properties or EntityProperties()
        self._check_free(path)
        self._check_partitioning(path, properties)
        now = self.clock()
        topic = Topic(path, properties, created_at=now, updated_at=now)
        self.topics[path] = topic
        return topic

    def create_subscription(
        self, topic_path: str, name: str, properties: SubscriptionProperties | None = None
    ) -> Entity:
        topic = self.topics.get(topic_path)
        if topic is None:
            raise not_found(topic_path)
        if name in topic.subscriptions:
            raise BrokerError(
                "com.microsoft:entity-already-exists",
                f"Subscription '{topic_path}/Subscriptions/{name}' already exists.",
            )
        entity = Entity(
            self,
            f"{topic_path}/Subscriptions/{name}",
            properties or SubscriptionProperties(),
            fragments_down=topic.fragments_down,
            partitioned=topic.partitioned,
        )
        topic.subscriptions[name] = entity
        topic.rules[name] = RuleSet.with_default(self.clock())
        return entity

    def _check_free(self, path: str) -> None:
        if path in self.queues or path in self.topics:
            raise BrokerError(
                "com.microsoft:entity-already-exists", f"An entity named '{path}' already exists."
            )

    def partitioned_count(self) -> int:
        """Partitioned queues and topics in this namespace."""
        return sum(1 for q in self.queues.values() if q.partitioned) + sum(
            1 for t in self.topics.values() if t.partitioned
        )

    def _check_partitioning(self, path: str, properties: EntityProperties) -> None:
        if not properties.enable_partitioning:
            return
        check_partitioned_size(properties.max_size_in_megabytes)
        if self.partitioned_count() >= MAX_PARTITIONED_ENTITIES:
            raise BrokerError(
                "amqp:resource-limit-exceeded",
                f"SubCode=40300. Cannot create '{path}': the namespace already has "
                f"{MAX_PARTITIONED_ENTITIES} partitioned queues and topics, the maximum for the "
                "Standard tier. Delete one, or create this entity without partitioning.",
            )

    # -- fragments (partitions) -------------------------------------------------------------
    def _partitioned_target(self, path: str, index: int) -> Entity | Topic:
        target = self.resolve_target(path)
        if not target.partitioned:
            raise BrokerError(
                "com.microsoft:invalid-operation",
                f"'{path}' is not partitioned (enable_partitioning=False): it has no fragments.",
            )
        if not 0 <= index < PARTITION_COUNT:
            raise BrokerError(
                "amqp:invalid-field",
                f"Fragment index {index} is out of range: 0..{PARTITION_COUNT - 1}.",
            )
        return target

    def fragment_down(self, path: str, index: int) -> None:
        """Make fragment ``index`` of a partitioned queue or topic unavailable.

        Keyed sends to it fail (``com.microsoft:timeout``), unkeyed sends go to another
        fragment, and its stored messages are not delivered until :meth:`fragment_up`.
        """
        self._partitioned_target(path, index).fragments_down.add(index)

    def fragment_up(self, path: str, index: int) -> None:
        """Bring fragment ``index`` back; its held messages are delivered again."""
        target = self._partitioned_target(path, index)
        if index not in target.fragments_down:
            return
        target.fragments_down.discard(index)
        for entity in self._readers_of(target):
            entity.fragment_restored(index)

    def expire_session_locks(self, path: str) -> int:
        """Every session lock held on the queue or subscription ``path`` is lost now (a
        fault): its receivers are detached with ``com.microsoft:session-lock-lost``; how
        many locks were held.

        Raises:
            BrokerError: no such entity, or it is not session-enabled.
        """
        entity = self.resolve_source(path)
        if entity.sessions is None:
            raise BrokerError(
                "com.microsoft:invalid-operation",
                f"'{path}' is not session-enabled (requires_session=False): it has no session "
                "locks.",
            )
        return entity.sessions.expire_locks()

    def fragments_down(self) -> dict[str, list[int]]:
        """Every partitioned queue or topic with fragments down, and which."""
        result: dict[str, list[int]] = {}
        targets: list[Entity | Topic] = [*self.queues.values(), *self.topics.values()]
        for target in targets:
            if target.fragments_down:
                result[target.path] = sorted(target.fragments_down)
        return result

    def restore_fragments(self) -> None:
        """Bring every fragment of every entity back up."""
        for path, indexes in self.fragments_down().items():
            for index in indexes:
                self.fragment_up(path, index)

    @staticmethod
    def _readers_of(target: Entity | Topic) -> Iterator[Entity]:
        entities = list(target.subscriptions.values()) if isinstance(target, Topic) else [target]
        for entity in entities:
            yield entity
            if entity.dead_letter is not None:
                yield entity.dead_letter

    def _choose_fragment(self, target: Entity | Topic, parsed: Any, dedup: bool) -> int | None:
        """The fragment a message goes to (None for a non-partitioned entity).

        SessionId, else PartitionKey, else MessageId when duplicate detection is on: a
        keyed message must go to its key's fragment and fails when that is down. Anything
        else goes round-robin over the fragments that are up.
        """
        if not target.partitioned:
            return None
        down = target.fragments_down
        key: Any = parsed.session_id
        if key is None:
            key = parsed.annotations.get("x-opt-partition-key")
        if key is None and dedup:
            key = parsed.message_id
        if key is not None:
            fragment = fragment_of(key)
            if fragment in down:
                raise BrokerError(
                    "com.microsoft:timeout",
                    f"The partition {fragment} of '{target.path}' holding key '{key}' is "
                    "temporarily unavailable; retry the operation (injected fault).",
                )
            return fragment
        if len(down) >= PARTITION_COUNT:
            raise BrokerError(
                "com.microsoft:timeout",
                f"Every partition of '{target.path}' is unavailable; retry the operation "
                "(injected fault).",
            )
        start = self._round_robin.get(target.path, 0)
        for step in range(PARTITION_COUNT):
            fragment = (start + step) % PARTITION_COUNT
            if fragment not in down:
                self._round_robin[target.path] = fragment + 1
                return fragment
        raise AssertionError("unreachable: a fragment is up")

    def delete(self, path: str) -> bool:
        entity = self.queues.pop(path, None)
        if entity is not None:
            entity.purge()
            return True
        return self.topics.pop(path, None) is not None

    def purge(self) -> None:
        """Lose every message (a disaster); entity definitions stay."""
        for entity in self.iter_entities():
            entity.purge()
        self._dedup.clear()
        self._timers.clear()

    def iter_entities(self) -> Iterator[Entity]:
        yield from self.queues.values()
        for topic in self.topics.values():
            yield from topic.subscriptions.values()

    def resolve_source(self, address: str) -> Entity:
        """The entity a receiver address reads: a queue, a subscription, or a DLQ of either."""
        path = address.strip("/")
        dead_letter = False
        if path.lower().endswith("/$deadletterqueue"):
            path = path[: -len("/$DeadLetterQueue")]
            dead_letter = True
        entity = self.queues.get(path)
        if entity is None:
            parts = path.split("/")
            if len(parts) == 3 and parts[1].lower() == "subscriptions":
                topic = self.topics.get(parts[0])
                if topic is not None:
                    entity = topic.subscriptions.get(parts[2])
        if entity is None:
            raise not_found(path)
        if dead_letter:
            assert entity.dead_letter is not None
            return entity.dead_letter
        return entity

    def resolve_target(self, address: str) -> Entity | Topic:
        """The entity a sender address writes to: a queue or a topic."""
        path = address.strip("/")
        target: Entity | Topic | None = self.queues.get(path) or self.topics.get(path)
        if target is None:
            raise not_found(path)
        return target

    # -- sending ------------------------------------------------------------------------
    def send(self, target: Entity | Topic, payload: bytes) -> int:
        """Accept one transfer (a message or a batch); return how many messages it held.

        Raises:
            BrokerError: the message is too large or malformed.
        """
        if len(payload) > MAX_MESSAGE_SIZE:
            raise BrokerError(
                "amqp:link:message-size-exceeded",
                f"The message of {len(payload)} bytes exceeds the {MAX_MESSAGE_SIZE}-byte limit of "
                "this entity. Send a smaller message or split the batch.",
            )
        parsed = parse_message(payload)
        if is_batch(parsed):
            try:
                inner = [parse_message(payload[start:end]) for start, end in parsed.data_sections]
            except ValueError:
                inner = [parsed]
        else:
            inner = [parsed]
        properties = target.properties
        # Send targets are queues and topics, never subscriptions (see resolve_target).
        assert isinstance(properties, EntityProperties)
        now = self.clock()
        dedup = properties.requires_duplicate_detection
        # Check every message before storing any: a rejected transfer stores nothing.
        fragments = []
        for message in inner:
            _check_session_partition_key(message)
            _check_session_required(target, message)
            fragments.append(self._choose_fragment(target, message, dedup))
        for message, fragment in zip(inner, fragments, strict=True):
            if dedup:
                # Per fragment for partitioned entities: the MessageId is the fragment key
                # unless a SessionId or PartitionKey picked the fragment.
                dedup_key = target.path if fragment is None else (target.path, fragment)
                detector = self._dedup.setdefault(dedup_key, DuplicateDetector())
                window = properties.duplicate_detection_history_time_window.total_seconds()
                if detector.is_duplicate(message.message_id, now, window):
                    continue
            self._enqueue_parsed(target, message, now, scheduled_at=None, fragment=fragment)
        return len(inner)

    def schedule(self, target: Entity | Topic, payload: bytes, at: float | None) -> int:
        """Enqueue one message for later; return its sequence number."""
        parsed = parse_message(payload)
        _check_session_partition_key(parsed)
        _check_session_required(target, parsed)
        properties = target.properties
        assert isinstance(properties, EntityProperties)
        fragment = self._choose_fragment(target, parsed, properties.requires_duplicate_detection)
        return self._enqueue_parsed(
            target, parsed, self.clock(), scheduled_at=at, fragment=fragment
        )

    def _enqueue_parsed(
        self,
        target: Entity | Topic,
        parsed: Any,
        now: float,
        scheduled_at: float | None,
        fragment: int | None = None,
    ) -> int:
        annotations = parsed.annotations
        if scheduled_at is None:
            raw_time = annotations.get("x-opt-scheduled-enqueue-time")
            if raw_time is not None:
                scheduled_at = _timestamp_seconds(raw_time)
        sequence = next(self._sequence)
        ttl_ms = parsed.ttl_ms
        default_ttl = target.properties.default_message_time_to_live
        ttl = ttl_ms / 1000 if ttl_ms else None
        if default_ttl < _MAX_TIMESPAN:
            ttl = min(ttl, default_ttl.total_seconds()) if ttl else default_ttl.total_seconds()
        starts_at = scheduled_at if scheduled_at and scheduled_at > now else now
        expires_at = starts_at + ttl if ttl else None
        partition_key = annotations.get("x-opt-partition-key")
        base = StoredMessage(
            sequence_number=sequence,
            message_id=parsed.message_id,
            bare=parsed.bare,
            annotation_entries=parsed.annotation_entries,
            annotation_count=parsed.annotation_count,
            durable=parsed.durable,
            priority=parsed.priority,
            ttl_ms=ttl_ms,
            content_type=parsed.content_type,
            session_id=parsed.session_id,
            partition_key=str(partition_key) if partition_key is not None else None,
            enqueued_at=now,
            expires_at=expires_at,
            scheduled_at=scheduled_at,
            fragment=fragment,
        )
        if base.content_type == PING_CONTENT_TYPE:
            # Service Bus never delivers a ping: accepted, billed, dropped (SPEC §3).
            return sequence
        if isinstance(target, Topic):
            self._fan_out(target, base)
        else:
            target.enqueue(base)
        return sequence

    def _fan_out(self, topic: Topic, base: StoredMessage) -> None:
        """Copy ``base`` to each subscription whose rules match it (``RuleSet.route``).

        The first copy in a subscription keeps the message's sequence number; each further
        copy (one per matching rule with an action) takes a new one, as it is another message.
        """
        context: StoredMessageContext | None = None

        def view() -> StoredMessageContext:
            nonlocal context
            if context is None:
                context = StoredMessageContext(base)
            return context

        for name, subscription in topic.subscriptions.items():
            rules = topic.rules.get(name)
            copies = rules.route(view) if rules is not None else [None]
            for index, copy in enumerate(copies):
                message = replace(base)
                if index:
                    message.sequence_number = next(self._sequence)
                if copy is not None and (copy.changes or copy.removed):
                    message.bare = _with_application_properties(
                        base.bare, copy.changes, copy.removed
                    )
                subscription.enqueue(message)

    def cancel_scheduled(self, target: Entity | Topic, sequence_numbers: list[int]) -> None:
        """Cancel scheduled messages. As the service, a number that is not a scheduled
        message (never scheduled, cancelled already, or enqueued since) is refused:
        ``com.microsoft:message-not-found``, "Messages not found. Missing sequence numbers"
        (the others are cancelled). A topic's copies wait in its subscriptions here: a
        number is missing when no subscription has it (a topic without subscriptions
        kept nothing to cancel, and refuses nothing)."""
        if isinstance(target, Topic):
            subscriptions = list(target.subscriptions.values())
            missing = set(sequence_numbers) if subscriptions else set()
            for subscription in subscriptions:
                missing &= set(subscription.cancel_scheduled(sequence_numbers))
        else:
            missing = set(target.cancel_scheduled(sequence_numbers))
        if missing:
            numbers = ", ".join(str(n) for n in sequence_numbers if n in missing)
            raise BrokerError(
                "com.microsoft:message-not-found",
                f"Messages not found. Missing sequence numbers: {numbers}",
            )

    # -- timers -------------------------------------------------------------------------
    def add_timer(self, deadline: float, kind: int, target: TimerTarget, payload: Any) -> None:
        """Call ``target.on_timer(kind, payload, now)`` at ``deadline`` (an entity's
        ``payload`` is a StoredMessage; its sessions' a session or a waiting receiver)."""
        earliest = self._timers[0][0] if self._timers else None
        heapq.heappush(self._timers, (deadline, next(self._timer_ids), kind, target, payload))
        if self._on_timer_change is not None and (earliest is None or deadline < earliest):
            self._on_timer_change(deadline)

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def run_timers(self) -> None:
        """Fire every timer that is due."""
        now = self.clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, target, payload = heapq.heappop(timers)
            target.on_timer(kind, payload, now)


PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"


def fragment_of(key: Any) -> int:
    """The fragment of a partition key: a stable hash (CRC-32 of its text) mod 16."""
    return zlib.crc32(str(key).encode("utf-8")) % PARTITION_COUNT


def check_partitioned_size(max_size_in_megabytes: int) -> None:
    """Standard tier: a partitioned entity's per-fragment size is 1, 2, 3, 4 or 5 GB."""
    if max_size_in_megabytes not in PARTITIONED_SIZES_MB:
        raise BrokerError(
            "amqp:invalid-field",
            f"The specified value {max_size_in_megabytes} is invalid. The property "
            "MaxSizeInMegabytes of a partitioned entity must be one of the following values: "
            f"{';'.join(str(v) for v in PARTITIONED_SIZES_MB)} (per partition; the entity "
            f"holds {PARTITION_COUNT} times that).",
        )


#: The service's limit on MessageId, SessionId and PartitionKey, in characters.
MAX_ID_LENGTH = 128


def _check_session_partition_key(parsed: Any) -> None:
    """SessionId and PartitionKey, when both set, must be equal (the service checks always);
    each of them and the MessageId is at most 128 characters.

    The service refuses a longer id with ``com.microsoft:argument-out-of-range`` (the SDK:
    ``ServiceBusError``, not retried); the .NET SDK refuses it before sending.
    """
    partition_key = parsed.annotations.get("x-opt-partition-key")
    session_id = parsed.session_id
    for name, value in (
        ("MessageId", parsed.message_id),
        ("SessionId", session_id),
        ("PartitionKey", partition_key),
    ):
        if isinstance(value, str) and len(value) > MAX_ID_LENGTH:
            raise BrokerError(
                "com.microsoft:argument-out-of-range",
                f"The {name} of {len(value)} characters exceeds the maximum of "
                f"{MAX_ID_LENGTH}; use a shorter id (e.g. a hash of the long one).",
            )
    if session_id is not None and partition_key is not None and str(partition_key) != session_id:
        raise BrokerError(
            "com.microsoft:invalid-operation",
            f"The SessionId '{session_id}' and the PartitionKey '{partition_key}' of a message "
            "must be the same when both are set; set only one, or set them equal.",
        )


def _check_session_required(target: Entity | Topic, parsed: Any) -> None:
    """A session-enabled queue takes only messages with a SessionId (the service refuses
    the transfer with ``amqp:not-allowed``; the SDK raises ``ServiceBusError``)."""
    if parsed.session_id is None and isinstance(target, Entity) and target.sessions is not None:
        raise BrokerError(
            "amqp:not-allowed",
            "The SessionId was not set on a message, and it cannot be sent to the entity. "
            "Entities that have session support enabled can only receive messages that have "
            f"the SessionId set to a valid value ('{target.path}' requires sessions: set "
            "session_id on the message).",
        )


def _timestamp_seconds(value: Any) -> float:
    if isinstance(value, int):
        return value / 1000
    raise BrokerError("amqp:invalid-field", "x-opt-scheduled-enqueue-time must be a timestamp")
