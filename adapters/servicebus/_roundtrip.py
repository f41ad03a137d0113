"""A two-region round trip through the real SDK: what ``georep demo`` runs today.

For each namespace: send messages in batches, receive them in peek-lock mode and
complete them, and check every MessageId came back exactly once. Then take the first
namespace through an outage and show that a send fails, the stored messages survive,
and sends work again after the namespace is restored.
"""

from __future__ import annotations

__all__ = ["OutageCheck", "RegionResult", "outage_check", "round_trip"]

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError


@dataclass(frozen=True)
class RegionResult:
    """What one namespace did with ``sent`` messages."""

    region: str
    sent: int
    received: int
    lost: int
    duplicates: int
    send_seconds: float
    receive_seconds: float

    @property
    def send_rate(self) -> float:
        return self.sent / self.send_seconds if self.send_seconds else 0.0

    @property
    def receive_rate(self) -> float:
        return self.received / self.receive_seconds if self.receive_seconds else 0.0


@dataclass(frozen=True)
class OutageCheck:
    """The outage scenario on one namespace."""

    region: str
    error_during_outage: str
    stored_before: int
    stored_after_restore: int
    send_after_restore_ok: bool


async def round_trip(
    region: str,
    connection_string: str,
    queue: str,
    count: int,
    *,
    batch_size: int = 100,
    on_progress: Callable[[int], None] | None = None,
) -> RegionResult:
    """Send ``count`` messages to ``queue`` and receive them all back."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    async with ServiceBusClient.from_connection_string(connection_string) as client:
        started = time.perf_counter()
        async with client.get_queue_sender(queue) as sender:
            for start in range(0, count, batch_size):
                chunk = ids[start : start + batch_size]
                await sender.send_messages(
                    [ServiceBusMessage(f"order {i}", message_id=i) for i in chunk]
                )
        send_seconds = time.perf_counter() - started
        seen: Counter[str] = Counter()
        started = time.perf_counter()
        async with client.get_queue_receiver(queue, prefetch_count=batch_size) as receiver:
            while sum(seen.values()) < count:
                messages = await receiver.receive_messages(
                    max_message_count=batch_size, max_wait_time=5
                )
                if not messages:
                    break
                for message in messages:
                    await receiver.complete_message(message)
                    seen[str(message.message_id)] += 1
                if on_progress is not None:
                    on_progress(len(messages))
        receive_seconds = time.perf_counter() - started
    expected = set(ids)
    return RegionResult(
        region=region,
        sent=count,
        received=sum(seen.values()),
        lost=len(expected - set(seen)),
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        send_seconds=send_seconds,
        receive_seconds=receive_seconds,
    )


async def outage_check(
    region: str,
    connection_string: str,
    queue: str,
    *,
    outage: Callable[[], None],
    restore: Callable[[], None],
    stored: Callable[[], int],
) -> OutageCheck:
    """Store a message, take the namespace down, try a send, restore, send again."""
    async with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("before the outage"))
        stored_before = stored()
        outage()
        error = "none (unexpected)"
        try:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage("during the outage"), timeout=5)
        except ServiceBusError as exc:
            error = type(exc).__name__
        restore()
        stored_after = stored()
        ok = True
        try:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage("after the outage"))
        except ServiceBusError:
            ok = False
    return OutageCheck(region, error, stored_before, stored_after, ok)
