"""In-memory regions: a sender that accepts or fails on demand, a peek-lock queue."""

from __future__ import annotations

__all__ = ["FakeReceivedMessage", "InMemoryRegionReceiver", "InMemoryRegionSender"]

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self

from georep._region_identity import RegionLabels
from georep._slot import RegionSlot
from georep.exceptions import MessageNotFoundError, region_error
from georep.ports import Delivery, ErrorKind
from georep.testing._clock import FakeClock
from georep.testing._faults import FaultSwitch
from georep.testing._messages import FakeCodec, FakeMessage


def dedup_value(message: Any, dedup_source: str, dedup_name: str | None) -> str | None:
    """A fake received copy's dedup key value (``dedup_source`` as in DedupKey)."""
    if dedup_source == "message_id":
        key = message.message_id
    elif dedup_source == "subject":
        key = message.subject
    else:
        key = message.application_properties.get(dedup_name or "")
    return None if key is None else str(key)


class FakeLabels(RegionLabels):
    """A fake region's labels; the namespace defaults to ``{region}.servicebus.example``."""

    def __init__(self, region: str, namespace: str | None, entity: str) -> None:
        super().__init__(region, namespace or f"{region}.servicebus.example", entity)


class InMemoryRegionSender(FaultSwitch, FakeLabels):
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
        clock: FakeClock | None = None,
        max_message_size: int = 262_144,
    ) -> None:
        FaultSwitch.__init__(self, region)
        FakeLabels.__init__(self, region, namespace, entity)
        self._clock = clock
        self.latency = 0.0
        self._codec = FakeCodec()
        self._max_message_size = max_message_size
        self._sequence = itertools.count(1)
        self.accepted: list[FakeMessage] = []
        self.scheduled: dict[int, FakeMessage] = {}
        self.attempts = 0
        self.closed = False
        self.payloads: list[Any] = []
        self._slot = RegionSlot()

    @property
    def codec(self) -> FakeCodec:
        return self._codec

    async def _check(self) -> None:
        self.attempts += 1
        if self.latency:
            if self._clock is None:
                raise RuntimeError("InMemoryRegionSender(clock=...) is needed for latency")
            await self._clock.sleep(self.latency)
        await self._injected_fault()

    def slot(self) -> RegionSlot:
        return self._slot

    async def send(self, messages: Any, *, timeout: float) -> None:
        await self._check()
        split = self._codec.split(messages)
        size = sum(len(m.body) for m in split)
        if size > self._max_message_size:
            # As the service refuses it (SDK: MessageSizeExceededError), nothing stored.
            raise region_error(
                f"{self._region}: {size} bytes is over the entity's limit of "
                f"{self._max_message_size} bytes",
                region=self._region,
                kind=ErrorKind.MESSAGE_TOO_LARGE,
            )
        self.payloads.append(messages)
        self.accepted.extend(split)

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
        """Cancel the numbers this region holds; as the service, refuse those it does not
        (``MessageNotFoundError``: never scheduled, or cancelled already)."""
        await self._check()
        missing = [n for n in sequence_numbers if self.scheduled.pop(n, None) is None]
        if missing:
            raise MessageNotFoundError(
                f"{self._region}: Messages not found. Missing sequence numbers: "
                + ", ".join(str(n) for n in missing),
                region=self._region,
                kind=ErrorKind.INVALID_ARGUMENT,
            )

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
    session_id: str | None = None

    @classmethod
    def stored(cls, message: FakeMessage, sequence_number: int, **fields: Any) -> Self:
        """The copy a region stores of a sent ``message`` (its properties copied)."""
        return cls(
            message.body,
            message.message_id,
            message.subject,
            dict(message.application_properties),
            sequence_number=sequence_number,
            **fields,
        )


class InMemoryRegionReceiver(FakeLabels):
    """One fake region's queue with peek-lock semantics, on a :class:`FakeClock`.

    Attributes:
        completed: Copies completed, in order.
        abandoned: Copies abandoned, in order.
        released: Copies handed back unseen (``release``: no delivery counted), in order.
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
        super().__init__(region, namespace, entity)
        self._clock = clock
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self._sequence = itertools.count(1)
        self._tokens = itertools.count(1)
        self._available: list[FakeReceivedMessage] = []
        self._locked: dict[int, FakeReceivedMessage] = {}
        self.completed: list[FakeReceivedMessage] = []
        self.abandoned: list[FakeReceivedMessage] = []
        self.released: list[FakeReceivedMessage] = []
        self.dead_lettered: list[FakeReceivedMessage] = []
        self.deferred: list[FakeReceivedMessage] = []
        self.closed = False

    def put(self, message: FakeMessage, *, content_type: str | None = None) -> None:
        """Enqueue a copy of ``message`` (as a sender's accepted message would be)."""
        self._available.append(
            FakeReceivedMessage.stored(message, next(self._sequence), content_type=content_type)
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
            self._make_available(message)

    def _make_available(self, message: FakeReceivedMessage) -> None:
        self._available.append(message)
        self._available.sort(key=lambda m: m.sequence_number)

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        return Delivery(
            key=dedup_value(message, dedup_source, dedup_name),
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
            raise region_error(
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

    async def release(self, message: Any) -> None:
        """Hand the copy back unseen (AMQP ``released``): not a delivery attempt."""
        held = self._held(message)
        del self._locked[held.lock_token]
        self.released.append(held)
        self._make_available(held)

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
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
