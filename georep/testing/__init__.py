"""In-memory fakes of georep's ports, for unit tests (yours and ours).

Nothing here does I/O or sleeps for real:

- :class:`FakeClock`: time moves only when the test calls :meth:`FakeClock.advance`.
- :class:`InMemoryRegionSender` with :class:`FakeMessage`/:class:`FakeCodec`: a region
  that accepts, fails with a chosen :class:`~georep.ports.ErrorKind`, or hangs.
- :class:`InMemoryOutbox`: the outbox contract without a file.
- :class:`InMemoryLedger`: the delivery ledger in lists.
- :class:`InMemoryRegionReceiver` and :class:`InMemorySeenSet`: a peek-lock queue and the
  seen-set, on the same fake clock.
- :class:`InMemoryRelayEndpoint`: a relay endpoint served in-process, failing on demand.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from georep._classify import error_type as classified_error_type
from georep._slot import RegionSlot
from georep.exceptions import (
    InvalidMessageError,
    RegionError,
)
from georep.ports import Delivery, ErrorKind
from georep.testing._clock import FakeClock
from georep.testing._clock import settle as settle  # tests wait for ready tasks with it
from georep.testing._ledger import InMemoryLedger
from georep.testing._outbox import InMemoryOutbox
from georep.testing._relay import InMemoryRelayEndpoint
from georep.testing._seen import InMemorySeenSet

__all__ = [
    "FakeBatch",
    "FakeClock",
    "FakeCodec",
    "FakeMessage",
    "FakeReceivedMessage",
    "InMemoryLedger",
    "InMemoryOutbox",
    "InMemoryRegionReceiver",
    "InMemoryRegionSender",
    "InMemoryRelayEndpoint",
    "InMemorySeenSet",
]


@dataclass
class FakeMessage:
    """A message for :class:`InMemoryRegionSender`: a body and the fields georep reads."""

    body: bytes = b""
    message_id: str | None = None
    subject: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    time_to_live: float | None = None
    """Seconds, or None for no time-to-live."""


class FakeBatch:
    """A batch of :class:`FakeMessage` built by :meth:`FakeCodec.new_batch`."""

    georep_prepared = True

    def __init__(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> None:
        self.max_size_in_bytes = max_size_in_bytes
        self.messages: list[FakeMessage] = []
        self.size_in_bytes = 0
        self._prepare = prepare

    def add_message(self, message: FakeMessage) -> None:
        size = len(message.body)
        if self.size_in_bytes + size > self.max_size_in_bytes:
            raise ValueError(f"batch is full ({self.max_size_in_bytes} bytes)")
        self._prepare(message)
        self.messages.append(message)
        self.size_in_bytes += size

    def __len__(self) -> int:
        return len(self.messages)


class FakeCodec:
    """The :class:`georep.ports.MessageCodec` for :class:`FakeMessage`."""

    def split(self, messages: Any) -> list[Any]:
        if isinstance(messages, FakeMessage):
            return [messages]
        if isinstance(messages, FakeBatch):
            return list(messages.messages)
        if isinstance(messages, Iterable) and not isinstance(messages, str | bytes):
            items = list(messages)
            if all(isinstance(item, FakeMessage) for item in items):
                return items
        raise InvalidMessageError(f"cannot send a {type(messages).__name__}")

    def is_batch(self, messages: Any) -> bool:
        return isinstance(messages, FakeBatch)

    def message_id(self, message: Any) -> str | None:
        return message.message_id  # type: ignore[no-any-return]

    def set_message_id(self, message: Any, message_id: str) -> None:
        message.message_id = message_id

    def subject(self, message: Any) -> str | None:
        return message.subject  # type: ignore[no-any-return]

    def application_property(self, message: Any, name: str) -> Any:
        return message.application_properties.get(name)

    def set_application_property(self, message: Any, name: str, value: str) -> None:
        message.application_properties[name] = value

    def time_to_live(self, message: Any) -> float | None:
        return message.time_to_live  # type: ignore[no-any-return]

    def set_time_to_live(self, message: Any, seconds: float) -> None:
        message.time_to_live = seconds

    def copy(self, message: Any) -> Any:
        return FakeMessage(
            message.body,
            message.message_id,
            message.subject,
            dict(message.application_properties),
            message.time_to_live,
        )

    def encode(self, message: Any) -> bytes:
        return json.dumps(
            {
                "body": base64.b64encode(message.body).decode(),
                "message_id": message.message_id,
                "subject": message.subject,
                "application_properties": message.application_properties,
                "time_to_live": message.time_to_live,
            }
        ).encode()

    def decode(self, payload: bytes) -> Any:
        document = json.loads(payload)
        return FakeMessage(
            base64.b64decode(document["body"]),
            document["message_id"],
            document["subject"],
            document["application_properties"],
            document.get("time_to_live"),
        )

    def check(
        self, messages: Sequence[Any], *, one_partition: bool, max_size: int | None = None
    ) -> None:
        if max_size is not None and sum(len(m.body) for m in messages) > max_size:
            raise InvalidMessageError(f"the bodies are over the entity's limit of {max_size} bytes")
        # FakeMessage has no session id or partition key.

    def new_batch(self, max_size_in_bytes: int, prepare: Callable[[Any], object]) -> Any:
        return FakeBatch(max_size_in_bytes, prepare)


class InMemoryRegionSender:
    """One fake region: it stores what it accepts and fails on demand.

    Attributes:
        accepted: Every message this region accepted, in order.
        scheduled: Scheduled messages by sequence number (cancelled ones removed).
        attempts: Send calls made to it (accepted or not).
    """

    def __init__(
        self,
        region: str,
        namespace: str | None = None,
        entity: str = "orders",
        *,
        max_message_size: int = 262_144,
        clock: FakeClock | None = None,
    ) -> None:
        self._region = region
        self._clock = clock
        self.latency = 0.0
        self._namespace = namespace or f"{region}.servicebus.example"
        self._entity = entity
        self._codec = FakeCodec()
        self._failure: ErrorKind | None = None
        self._failures_left: int | None = None
        self._hanging = False
        self._max_message_size = max_message_size
        self._sequence = itertools.count(1)
        self.accepted: list[FakeMessage] = []
        self.scheduled: dict[int, FakeMessage] = {}
        self.attempts = 0
        self.closed = False
        self.payloads: list[Any] = []
        self._slot = RegionSlot()

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def entity(self) -> str:
        return self._entity

    @property
    def region(self) -> str:
        return self._region

    @property
    def codec(self) -> FakeCodec:
        return self._codec

    def fail_with(self, kind: ErrorKind | str, *, times: int | None = None) -> None:
        """Fail every operation (or the next ``times``) with an error of ``kind``."""
        self._failure = ErrorKind(kind)
        self._failures_left = times
        self._hanging = False

    def hang(self) -> None:
        """Never answer (like a blackholed namespace) until :meth:`restore`."""
        self._hanging = True
        self._failure = None

    def restore(self) -> None:
        """Accept again."""
        self._failure = None
        self._hanging = False

    async def _check(self) -> None:
        self.attempts += 1
        if self.latency:
            if self._clock is None:
                raise RuntimeError("InMemoryRegionSender(clock=...) is needed for latency")
            await self._clock.sleep(self.latency)
        if self._hanging:
            await asyncio.Event().wait()  # until the caller's deadline cancels it
        if self._failure is not None:
            kind = self._failure
            if self._failures_left is not None:
                self._failures_left -= 1
                if self._failures_left <= 0:
                    self._failure = None
            error_type = classified_error_type(kind)  # the one table
            raise error_type(
                f"{self._region}: injected {kind.value}", region=self._region, kind=kind
            )

    def slot(self) -> RegionSlot:
        return self._slot

    async def send(self, messages: Any, *, timeout: float) -> None:
        await self._check()
        size = sum(len(m.body) for m in self._codec.split(messages))
        if size > self._max_message_size:
            # As the service refuses it (SDK: MessageSizeExceededError), nothing stored.
            raise classified_error_type(ErrorKind.MESSAGE_TOO_LARGE)(
                f"{self._region}: {size} bytes is over the entity's limit of "
                f"{self._max_message_size} bytes",
                region=self._region,
                kind=ErrorKind.MESSAGE_TOO_LARGE,
            )
        self.payloads.append(messages)
        self.accepted.extend(self._codec.split(messages))

    async def schedule(
        self, messages: Sequence[Any], schedule_time_utc: datetime, *, timeout: float
    ) -> list[int]:
        await self._check()
        numbers = []
        for message in messages:
            number = next(self._sequence)
            self.scheduled[number] = message
            numbers.append(number)
        return numbers

    async def cancel_scheduled(self, sequence_numbers: Sequence[int], *, timeout: float) -> None:
        await self._check()
        for number in sequence_numbers:
            self.scheduled.pop(number, None)

    async def max_message_size(self, *, timeout: float) -> int:
        await self._check()
        return self._max_message_size

    async def probe(self, *, timeout: float) -> None:
        await self._check()

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeReceivedMessage:
    """A copy handed out by :class:`InMemoryRegionReceiver`."""

    body: bytes
    message_id: str | None
    subject: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    delivery_count: int = 1
    sequence_number: int = 0
    lock_token: int = 0
    locked_until: float = 0.0
    content_type: str | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None


class InMemoryRegionReceiver:
    """One fake region's queue with peek-lock semantics, on a :class:`FakeClock`.

    Attributes:
        completed: Copies completed, in order.
        abandoned: Copies abandoned, in order.
        deferred: Copies deferred, in order.
        dead_lettered: Messages dead-lettered (by a receiver, with its reason and
            description, or after ``max_delivery_count`` deliveries).
    """

    def __init__(
        self,
        region: str,
        namespace: str | None = None,
        entity: str = "orders",
        *,
        clock: FakeClock,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
    ) -> None:
        self._region = region
        self._namespace = namespace or f"{region}.servicebus.example"
        self._entity = entity
        self._clock = clock
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self._sequence = itertools.count(1)
        self._tokens = itertools.count(1)
        self._available: list[FakeReceivedMessage] = []
        self._locked: dict[int, FakeReceivedMessage] = {}
        self.completed: list[FakeReceivedMessage] = []
        self.abandoned: list[FakeReceivedMessage] = []
        self.dead_lettered: list[FakeReceivedMessage] = []
        self.deferred: list[FakeReceivedMessage] = []
        self.closed = False

    @property
    def region(self) -> str:
        return self._region

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def entity(self) -> str:
        return self._entity

    def put(self, message: FakeMessage, *, content_type: str | None = None) -> None:
        """Enqueue a copy of ``message`` (as a sender's accepted message would be)."""
        self._available.append(
            FakeReceivedMessage(
                message.body,
                message.message_id,
                message.subject,
                dict(message.application_properties),
                sequence_number=next(self._sequence),
                content_type=content_type,
            )
        )

    @property
    def pending(self) -> int:
        """Copies not yet completed (available or locked)."""
        self._expire_locks()
        return len(self._available) + len(self._locked)

    def _expire_locks(self) -> None:
        now = self._clock.time()
        for token, message in list(self._locked.items()):
            if message.locked_until <= now:
                del self._locked[token]
                self._redeliver(message)

    def _redeliver(self, message: FakeReceivedMessage) -> None:
        message.delivery_count += 1
        if message.delivery_count > self.max_delivery_count:
            self.dead_lettered.append(message)
        else:
            self._available.append(message)
            self._available.sort(key=lambda m: m.sequence_number)

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        if dedup_source == "message_id":
            key = message.message_id
        elif dedup_source == "subject":
            key = message.subject
        else:
            key = message.application_properties.get(dedup_name or "")
        return Delivery(
            key=None if key is None else str(key),
            delivery_count=message.delivery_count,
            enqueued_at=None,
            locked_until=message.locked_until,
            traceparent=message.application_properties.get("traceparent"),
            content_type=message.content_type,
        )

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        self._expire_locks()
        if not self._available:
            await self._clock.sleep(max_wait)
            self._expire_locks()
        batch, self._available = self._available[:max_messages], self._available[max_messages:]
        copies = []
        for message in batch:
            message.lock_token = next(self._tokens)
            message.locked_until = self._clock.time() + self.lock_duration
            self._locked[message.lock_token] = message
            # Each delivery is a separate object, as the SDK hands out.
            copies.append(dataclasses.replace(message))
        return copies

    def _held(self, message: Any) -> FakeReceivedMessage:
        self._expire_locks()
        held = self._locked.get(message.lock_token)
        if held is None:
            raise RegionError(
                f"{self._region}: lock lost", region=self._region, kind=ErrorKind.LOCK_LOST
            )
        return held

    async def peek(self, count: int) -> list[Any]:
        self._expire_locks()
        # As the service: peek sees every stored message, locked and deferred ones too.
        stored = sorted(
            [*self._available, *self._locked.values(), *self.deferred],
            key=lambda m: m.sequence_number,
        )
        return [dataclasses.replace(m) for m in stored[:count]]

    async def complete(self, message: Any) -> None:
        held = self._held(message)
        del self._locked[held.lock_token]
        self.completed.append(held)

    async def abandon(self, message: Any) -> None:
        held = self._held(message)
        del self._locked[held.lock_token]
        self.abandoned.append(held)
        self._redeliver(held)

    async def dead_letter(self, message: Any, reason: str, description: str) -> None:
        held = self._held(message)
        del self._locked[held.lock_token]
        held.dead_letter_reason = reason
        held.dead_letter_error_description = description
        self.dead_lettered.append(held)

    async def defer(self, message: Any) -> None:
        held = self._held(message)
        del self._locked[held.lock_token]
        self.deferred.append(held)

    async def renew_lock(self, message: Any) -> float | None:
        held = self._held(message)
        held.locked_until = self._clock.time() + self.lock_duration
        return held.locked_until

    async def close(self) -> None:
        self.closed = True
