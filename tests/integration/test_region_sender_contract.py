"""The RegionSender contract, run against every implementation of the port.

Parameters: ``memory`` (:class:`georep.testing.InMemoryRegionSender`), ``async-sdk``
(:class:`ServiceBusRegionSender` on the real async azure-servicebus SDK) and ``sync-sdk``
(:class:`SyncServiceBusRegionSender` on the sync SDK, calls on a worker thread), the last
two against a private emulator (these tests take the namespace down). The same assertions
for all three keep the double from drifting from what the SDK really does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient as SyncClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncClient

from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import ServiceBusRegionSender, SyncServiceBusRegionSender
from georep.exceptions import RegionError
from georep.ports import ErrorKind, RegionSender
from georep.testing import FakeMessage, InMemoryRegionSender

pytestmark = pytest.mark.integration

IMPLEMENTATIONS = ["memory", "async-sdk", "sync-sdk"]
TIMEOUT = 10.0
UNAVAILABLE = {ErrorKind.CONNECTION, ErrorKind.TIMEOUT}


@dataclass
class Harness:
    """One implementation under test, for one queue.

    Attributes:
        kind: The parameter's name.
        queue: The queue the harness's senders send to.
    """

    kind: str
    emu: Emulator
    queue: str
    stack: AsyncExitStack
    doubles: dict[str, InMemoryRegionSender] = field(default_factory=dict)
    sync_clients: list[SyncClient] = field(default_factory=list)
    async_client: AsyncClient | None = None

    async def sender(self, entity: str | None = None) -> RegionSender:
        """A sender for ``entity`` (default the harness's queue); closed by the fixture."""
        entity = entity or self.queue
        if self.kind == "memory":
            double = InMemoryRegionSender("primary", entity=entity)
            if entity != self.queue:
                double.fail_with(ErrorKind.ENTITY_NOT_FOUND)  # the double has one entity
            self.doubles[entity] = double
            return double
        if self.kind == "async-sdk":
            if self.async_client is None:
                self.async_client = await self.stack.enter_async_context(
                    AsyncClient.from_connection_string(
                        self.emu.connection_string("primary"), retry_total=0
                    )
                )
            # Not entered: entering opens the link, and the port must report a missing
            # entity from its own calls.
            sdk = self.async_client.get_queue_sender(entity)
            self.stack.push_async_callback(sdk.close)
            return ServiceBusRegionSender(sdk, region="primary")
        client = SyncClient.from_connection_string(
            self.emu.connection_string("primary"), retry_total=0
        )
        self.stack.callback(client.close)
        sync_sdk = client.get_queue_sender(entity)
        self.stack.callback(sync_sdk.close)
        adapter = SyncServiceBusRegionSender(sync_sdk, region="primary", idle_exit=1.0)
        self.stack.push_async_callback(adapter.close)
        return adapter

    def message(self, body: bytes, message_id: str) -> Any:
        if self.kind == "memory":
            return FakeMessage(body, message_id=message_id)
        return ServiceBusMessage(body, message_id=message_id)

    def landed(self) -> list[str]:
        """The ids stored in the queue, in order (received and deleted for the SDK)."""
        if self.kind == "memory":
            return [str(m.message_id) for m in self.doubles[self.queue].accepted]
        with (
            SyncClient.from_connection_string(self.emu.connection_string("primary")) as client,
            client.get_queue_receiver(self.queue, receive_mode="receiveanddelete") as receiver,
        ):
            ids: list[str] = []
            while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1):
                ids.extend(str(m.message_id) for m in batch)
            return ids

    def scheduled(self) -> int:
        """Scheduled messages stored in the queue (nothing else is there in these tests)."""
        if self.kind == "memory":
            return len(self.doubles[self.queue].scheduled)
        return self.emu.namespace("primary").message_count(self.queue)

    async def down(self) -> None:
        if self.kind == "memory":
            self.doubles[self.queue].fail_with(ErrorKind.CONNECTION)
        else:
            await asyncio.to_thread(self.emu.namespace("primary").outage)


@pytest.fixture(params=IMPLEMENTATIONS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    emu: Emulator | None = None
    queue = f"snd-{uuid.uuid4().hex[:8]}"
    if request.param != "memory":
        emu = request.getfixturevalue("emu")
        emu.namespace("primary").create_queue(queue)
    async with AsyncExitStack() as stack:
        yield Harness(request.param, emu, queue, stack)  # type: ignore[arg-type]
    if emu is not None:
        await asyncio.to_thread(emu.namespace("primary").restore)


async def test_is_a_region_sender_naming_its_entity(harness: Harness) -> None:
    sender = await harness.sender()
    assert isinstance(sender, RegionSender)
    assert (sender.region, sender.entity) == ("primary", harness.queue)
    assert sender.namespace
    # One slot per SDK sender: the same object every time.
    assert sender.slot() is sender.slot()


async def test_send_one_a_list_and_a_batch_land_with_their_ids(harness: Harness) -> None:
    sender = await harness.sender()
    codec = sender.codec
    await sender.send(harness.message(b"one", "id-1"), timeout=TIMEOUT)
    await sender.send(
        [harness.message(b"two", "id-2"), harness.message(b"three", "id-3")], timeout=TIMEOUT
    )
    size = await sender.max_message_size(timeout=TIMEOUT)
    batch = codec.new_batch(size, lambda message: None)
    batch.add_message(harness.message(b"four", "id-4"))
    batch.add_message(harness.message(b"five", "id-5"))
    assert codec.is_batch(batch)
    assert [codec.message_id(m) for m in codec.split(batch)] == ["id-4", "id-5"]
    await sender.send(batch, timeout=TIMEOUT)
    assert await asyncio.to_thread(harness.landed) == [f"id-{i}" for i in range(1, 6)]


async def test_max_message_size_is_positive(harness: Harness) -> None:
    sender = await harness.sender()
    assert await sender.max_message_size(timeout=TIMEOUT) > 0


async def test_schedule_returns_sequence_numbers_and_cancel_removes_them(
    harness: Harness,
) -> None:
    sender = await harness.sender()
    later = datetime.now(UTC) + timedelta(hours=1)
    numbers = await sender.schedule(
        [harness.message(b"a", "s-1"), harness.message(b"b", "s-2")], later, timeout=TIMEOUT
    )
    assert len(numbers) == 2
    assert len(set(numbers)) == 2
    assert all(isinstance(n, int) for n in numbers)
    assert await asyncio.to_thread(harness.scheduled) == 2
    await sender.cancel_scheduled(numbers, timeout=TIMEOUT)
    assert await asyncio.to_thread(harness.scheduled) == 0


async def test_probe_succeeds_on_a_healthy_region_and_changes_nothing(harness: Harness) -> None:
    sender = await harness.sender()
    await sender.probe(timeout=TIMEOUT)
    assert await asyncio.to_thread(harness.landed) == []


async def test_a_region_down_raises_region_error_of_an_unavailable_kind(
    harness: Harness,
) -> None:
    sender = await harness.sender()
    await harness.down()
    with pytest.raises(RegionError) as caught:
        await sender.probe(timeout=5)
    assert caught.value.kind in UNAVAILABLE
    assert caught.value.region == "primary"
    with pytest.raises(RegionError) as caught:
        await sender.send(harness.message(b"x", "down-1"), timeout=5)
    assert caught.value.kind in UNAVAILABLE


async def test_an_unknown_entity_raises_entity_not_found(harness: Harness) -> None:
    sender = await harness.sender(f"missing-{uuid.uuid4().hex[:6]}")
    with pytest.raises(RegionError) as caught:
        await sender.send(harness.message(b"x", "nf-1"), timeout=TIMEOUT)
    assert caught.value.kind == ErrorKind.ENTITY_NOT_FOUND


async def test_an_oversize_message_raises_message_too_large(harness: Harness) -> None:
    sender = await harness.sender()
    size = await sender.max_message_size(timeout=TIMEOUT)
    with pytest.raises(RegionError) as caught:
        await sender.send(harness.message(b"z" * (size + 1024), "big-1"), timeout=TIMEOUT)
    assert caught.value.kind == ErrorKind.MESSAGE_TOO_LARGE
    assert await asyncio.to_thread(harness.landed) == []


async def test_close_never_closes_the_callers_sdk_sender(harness: Harness) -> None:
    sender = await harness.sender()
    await sender.close()
    await sender.close()  # idempotent
    if harness.kind == "memory":
        return  # the double has no SDK object; closing it is recorded only
    # The caller's SDK sender still works after georep closed its adapter.
    sdk = sender.sdk_sender  # type: ignore[attr-defined]
    message = ServiceBusMessage(b"after", message_id="after-close")
    if harness.kind == "async-sdk":
        await sdk.send_messages(message)
    else:
        await asyncio.to_thread(sdk.send_messages, message)
    assert await asyncio.to_thread(harness.landed) == ["after-close"]


async def test_codec_round_trips_copies_and_reads_time_to_live(harness: Harness) -> None:
    sender = await harness.sender()
    codec = sender.codec
    message = harness.message(b"body", "codec-1")
    codec.set_application_property(message, "tenant", "t1")
    assert codec.time_to_live(message) is None
    codec.set_time_to_live(message, 90.0)
    assert codec.time_to_live(message) == pytest.approx(90.0)
    copy = codec.copy(message)
    assert copy is not message
    assert codec.message_id(copy) == "codec-1"
    assert codec.application_property(copy, "tenant") == "t1"
    codec.set_message_id(copy, "codec-2")
    assert codec.message_id(message) == "codec-1"  # independent copy
    decoded = codec.decode(codec.encode(message))
    assert codec.message_id(decoded) == "codec-1"
    assert codec.application_property(decoded, "tenant") == "t1"
    assert codec.time_to_live(decoded) == pytest.approx(90.0)
    assert codec.split(decoded) == [decoded]
    assert not codec.is_batch(decoded)
