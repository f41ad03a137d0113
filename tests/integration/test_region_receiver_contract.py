"""The RegionReceiver contract, run against every implementation of the port.

Parameters: ``memory`` (:class:`georep.testing.InMemoryRegionReceiver` on a FakeClock),
``async-sdk`` (:class:`ServiceBusRegionReceiver` on the real async azure-servicebus SDK) and
``sync-sdk`` (:class:`SyncServiceBusRegionReceiver` on the sync SDK, calls on a worker
thread), the last two against one emulator for the module. Time moves through the
harness's ``advance``: the FakeClock for the double, real seconds for the SDK.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient as SyncClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient as AsyncClient
from azure.servicebus.amqp import AmqpAnnotatedMessage

from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import ServiceBusRegionReceiver, SyncServiceBusRegionReceiver
from georep.exceptions import RegionError
from georep.ports import ErrorKind, RegionReceiver
from georep.testing import FakeClock, FakeMessage, InMemoryRegionReceiver, settle

pytestmark = pytest.mark.integration

IMPLEMENTATIONS = ["memory", "async-sdk", "sync-sdk"]
LOCK_DURATION = 2
"""Seconds (real for the SDK): short, so the lost-lock case waits little."""
WAIT = 5.0
"""max_wait for receives that expect messages (they return as soon as some arrive)."""


@pytest.fixture(scope="module")
def helper_client(emu: Emulator) -> Iterator[SyncClient]:
    """One sync client for the module's test set-up (sending, reading the DLQ)."""
    with SyncClient.from_connection_string(emu.connection_string("primary")) as client:
        yield client


@dataclass
class Harness:
    """One implementation under test, for one fresh queue."""

    kind: str
    queue: str
    receiver: RegionReceiver
    emu: Emulator | None
    clock: FakeClock
    client: SyncClient | None
    """The module's sync client the harness sends and reads the DLQ with (SDK cases)."""

    @property
    def double(self) -> InMemoryRegionReceiver:
        assert isinstance(self.receiver, InMemoryRegionReceiver)
        return self.receiver

    def now(self) -> float:
        return self.clock.time() if self.kind == "memory" else time.time()

    async def advance(self, seconds: float) -> None:
        if self.kind == "memory":
            await self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)  # the broker's lock timer runs in real time

    async def put(self, *ids: str, content_type: str | None = None) -> None:
        """Enqueue messages with these ids (as a sender's accepted messages)."""
        if self.kind == "memory":
            for message_id in ids:
                self.double.put(FakeMessage(b"m", message_id=message_id), content_type=content_type)
            return
        client = self.client
        assert client is not None

        def send() -> None:
            with client.get_queue_sender(self.queue) as sender:
                sender.send_messages(
                    [ServiceBusMessage(b"m", message_id=i, content_type=content_type) for i in ids]
                )

        await asyncio.to_thread(send)

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        """The port's receive; for the double, its FakeClock moves through the wait."""
        if self.kind != "memory":
            return await self.receiver.receive(max_messages, max_wait=max_wait)
        task = asyncio.ensure_future(self.receiver.receive(max_messages, max_wait=max_wait))
        await settle()
        if not task.done():  # waiting on an empty queue: let the wait pass
            await self.clock.advance(max_wait)
        return await task

    async def receive_ids(self, count: int, max_wait: float = WAIT) -> list[Any]:
        """Receive until ``count`` copies arrived (the SDK may answer in parts)."""
        copies: list[Any] = []
        deadline = time.monotonic() + max_wait
        while len(copies) < count and time.monotonic() < deadline:
            copies += await self.receive(count - len(copies), max_wait=max_wait)
            if self.kind == "memory":
                break
        return copies

    async def dead_letter_reasons(self) -> list[tuple[str | None, str | None]]:
        if self.kind == "memory":
            return [
                (m.dead_letter_reason, m.dead_letter_error_description)
                for m in self.double.dead_lettered
            ]
        client = self.client
        assert client is not None

        def read() -> list[tuple[str | None, str | None]]:
            with client.get_queue_receiver(
                self.queue,
                sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                receive_mode="receiveanddelete",
            ) as dlq:
                # One expected: asking for one returns as soon as it is there.
                return [
                    (m.dead_letter_reason, m.dead_letter_error_description)
                    for m in dlq.receive_messages(max_message_count=1, max_wait_time=5)
                ]

        return await asyncio.to_thread(read)


@pytest.fixture(params=IMPLEMENTATIONS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    queue = f"rcv-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    async with AsyncExitStack() as stack:
        emu: Emulator | None = None
        helper: SyncClient | None = None
        receiver: RegionReceiver
        if request.param == "memory":
            receiver = InMemoryRegionReceiver(
                "primary", entity=queue, clock=clock, lock_duration=LOCK_DURATION
            )
        else:
            emu = request.getfixturevalue("emu")
            helper = request.getfixturevalue("helper_client")
            emu.namespace("primary").create_queue(
                queue, lock_duration=LOCK_DURATION, max_delivery_count=10
            )
            receiver = await sdk_receiver(stack, request.param, emu, queue)
        stack.push_async_callback(receiver.close)
        yield Harness(request.param, queue, receiver, emu, clock, helper)


async def sdk_receiver(
    stack: AsyncExitStack, kind: str, emu: Emulator, queue: str
) -> ServiceBusRegionReceiver:
    """The adapter over an SDK receiver of ``queue`` in the primary, async or sync
    (``kind``); ``stack`` closes the SDK's client and receiver."""
    if kind == "async-sdk":
        client = await stack.enter_async_context(
            AsyncClient.from_connection_string(emu.connection_string("primary"))
        )
        sdk = client.get_queue_receiver(queue)
        stack.push_async_callback(sdk.close)
        return ServiceBusRegionReceiver(sdk, region="primary")
    sync_client = SyncClient.from_connection_string(emu.connection_string("primary"))
    stack.callback(sync_client.close)
    sync_sdk = sync_client.get_queue_receiver(queue)
    stack.callback(sync_sdk.close)
    return SyncServiceBusRegionReceiver(sync_sdk, region="primary", idle_exit=1.0)


async def test_is_a_region_receiver_naming_its_entity(harness: Harness) -> None:
    assert isinstance(harness.receiver, RegionReceiver)
    assert (harness.receiver.region, harness.receiver.entity) == ("primary", harness.queue)
    assert harness.receiver.namespace


async def test_receive_returns_at_most_n_and_nothing_when_empty(harness: Harness) -> None:
    assert await harness.receive(5, max_wait=0.5) == []
    await harness.put("r-1", "r-2", "r-3")
    first = await harness.receive_ids(2)
    assert len(first) == 2
    rest = await harness.receive_ids(1)
    got = [harness.receiver.delivery(m, "message_id", None).key for m in first + rest]
    assert sorted(got) == ["r-1", "r-2", "r-3"]


async def test_delivery_reads_key_count_lock_and_content_type(harness: Harness) -> None:
    await harness.put("d-1", content_type="application/x-georep-ping")
    (copy,) = await harness.receive_ids(1)
    delivery = harness.receiver.delivery(copy, "message_id", None)
    assert delivery.key == "d-1"
    assert delivery.delivery_count == 1
    assert delivery.content_type == "application/x-georep-ping"
    assert delivery.locked_until is not None
    assert delivery.locked_until > harness.now()
    assert harness.receiver.delivery(copy, "property", "missing").key is None


async def test_complete_removes_the_message(harness: Harness) -> None:
    await harness.put("c-1")
    (copy,) = await harness.receive_ids(1)
    await harness.receiver.complete(copy)
    # Peek shows locked messages too, so an empty peek means it is gone.
    assert await harness.receiver.peek(5) == []
    assert await harness.receive(1, max_wait=0.5) == []


async def test_peek_shows_locked_messages_too(harness: Harness) -> None:
    await harness.put("k-1", "k-2")
    (copy,) = await harness.receive_ids(1)
    peeked = await harness.receiver.peek(5)
    assert [harness.receiver.delivery(m, "message_id", None).key for m in peeked] == [
        "k-1",
        "k-2",
    ]
    await harness.receiver.complete(copy)  # peeking did not disturb its lock


async def test_abandon_redelivers_with_delivery_count_plus_one(harness: Harness) -> None:
    await harness.put("a-1")
    (copy,) = await harness.receive_ids(1)
    await harness.receiver.abandon(copy)
    (again,) = await harness.receive_ids(1)
    delivery = harness.receiver.delivery(again, "message_id", None)
    assert (delivery.key, delivery.delivery_count) == ("a-1", 2)
    await harness.receiver.complete(again)


async def test_defer_keeps_it_out_of_receive(harness: Harness) -> None:
    await harness.put("f-1")
    (copy,) = await harness.receive_ids(1)
    await harness.receiver.defer(copy)
    await harness.advance(LOCK_DURATION + 0.5)  # no lock expiry brings it back either
    assert await harness.receive(1, max_wait=0.5) == []
    # It stays in the entity: peek still shows it.
    peeked = await harness.receiver.peek(5)
    assert [harness.receiver.delivery(m, "message_id", None).key for m in peeked] == ["f-1"]


async def test_dead_letter_lands_in_the_dlq_with_its_reason(harness: Harness) -> None:
    await harness.put("x-1")
    (copy,) = await harness.receive_ids(1)
    await harness.receiver.dead_letter(copy, "bad-order", "no such customer")
    assert await harness.dead_letter_reasons() == [("bad-order", "no such customer")]
    assert await harness.receive(1, max_wait=0.5) == []


async def test_renew_lock_extends_it(harness: Harness) -> None:
    await harness.put("n-1")
    (copy,) = await harness.receive_ids(1)
    before = harness.receiver.delivery(copy, "message_id", None).locked_until
    assert before is not None
    await harness.advance(1.0)
    renewed = await harness.receiver.renew_lock(copy)
    assert renewed is not None
    assert renewed > before
    # Past the first lock's expiry, the renewed lock still holds: complete succeeds.
    await harness.advance(before - harness.now() + 0.5)
    await harness.receiver.complete(copy)


async def test_peek_does_not_lock(harness: Harness) -> None:
    await harness.put("p-1", "p-2")
    peeked = await harness.receiver.peek(5)
    assert [harness.receiver.delivery(m, "message_id", None).key for m in peeked] == [
        "p-1",
        "p-2",
    ]
    copies = await harness.receive_ids(2)
    counts = [harness.receiver.delivery(m, "message_id", None).delivery_count for m in copies]
    assert counts == [1, 1]


async def test_settling_after_the_lock_expired_raises_lock_lost(harness: Harness) -> None:
    await harness.put("l-1")
    (copy,) = await harness.receive_ids(1)
    await harness.advance(LOCK_DURATION + 0.5)
    with pytest.raises(RegionError) as caught:
        await harness.receiver.complete(copy)
    assert caught.value.kind == ErrorKind.LOCK_LOST
    assert caught.value.region == "primary"


@pytest.mark.parametrize("kind", ["async-sdk", "sync-sdk"])
async def test_delivery_says_what_the_sdk_messages_properties_say(
    kind: str, emu: Emulator, helper_client: SyncClient
) -> None:
    """The adapter reads the AMQP sections directly (the SDK's properties are slow); each
    field must still be the SDK property's value, for string, UUID and absent ids."""
    queue = f"dlv-{uuid.uuid4().hex[:8]}"
    emu.namespace("primary").create_queue(queue)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent = [
        ServiceBusMessage(
            b"a",
            message_id="id-1",
            session_id="s-1",
            subject="subj",
            content_type="text/plain",
            application_properties={"traceparent": traceparent, "tenant": "t1"},
        ),
        AmqpAnnotatedMessage(data_body=b"b", properties={"message_id": uuid.uuid4()}),
        AmqpAnnotatedMessage(data_body=b"c"),  # no properties section at all
    ]
    with helper_client.get_queue_sender(queue) as sender:
        sender.send_messages(sent)
    async with AsyncExitStack() as stack:
        receiver = await sdk_receiver(stack, kind, emu, queue)
        stack.push_async_callback(receiver.close)
        copies: list[Any] = []
        while len(copies) < len(sent):
            copies += await receiver.receive(len(sent) - len(copies), max_wait=WAIT)

        def text(value: Any) -> str | None:
            return None if value is None else str(value)

        for copy in copies:
            properties = copy.application_properties or {}
            delivery = receiver.delivery(copy, "message_id", None)
            assert delivery.key == text(copy.message_id)
            assert receiver.delivery(copy, "subject", None).key == text(copy.subject)
            assert receiver.delivery(copy, "property", "tenant").key == (
                None if b"tenant" not in properties else properties[b"tenant"].decode()
            )
            assert delivery.delivery_count == copy.delivery_count + 1
            assert delivery.enqueued_at == pytest.approx(copy.enqueued_time_utc.timestamp())
            assert delivery.content_type == text(copy.content_type)
            assert delivery.session_id == text(copy.session_id)
        first = next(c for c in copies if c.message_id == "id-1")
        delivery = receiver.delivery(first, "message_id", None)
        assert (delivery.session_id, delivery.content_type) == ("s-1", "text/plain")
        assert delivery.traceparent == traceparent
        assert receiver.delivery(first, "subject", None).key == "subj"
        assert receiver.delivery(first, "property", "tenant").key == "t1"
        bare = next(c for c in copies if b"".join(c.body) == b"c")
        assert receiver.delivery(bare, "message_id", None).session_id is None


async def _received(
    stack: AsyncExitStack, emu: Emulator, helper_client: SyncClient, count: int
) -> tuple[ServiceBusRegionReceiver, str, list[Any]]:
    """An async adapter over a new queue holding ``count`` messages, all received (locked),
    in delivery-id order."""
    queue = f"many-{uuid.uuid4().hex[:8]}"
    emu.namespace("primary").create_queue(queue)
    with helper_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b"x", message_id=f"m{i}") for i in range(count)])
    receiver = await sdk_receiver(stack, "async-sdk", emu, queue)
    stack.push_async_callback(receiver.close)
    copies: list[Any] = []
    while len(copies) < count:
        copies += await receiver.receive(count - len(copies), max_wait=WAIT)
    return receiver, queue, sorted(copies, key=lambda c: c._delivery_id)


async def test_complete_many_settles_runs_of_delivery_ids_in_one_disposition_each(
    emu: Emulator, helper_client: SyncClient
) -> None:
    """The async adapter's bulk completion: every copy given is gone, the others stay
    locked (gaps in the delivery ids split the runs), and the SDK sees them settled."""
    async with AsyncExitStack() as stack:
        receiver, queue, copies = await _received(stack, emu, helper_client, 40)
        kept = [copies[i] for i in (3, 17, 18, 30)]
        done = [c for c in copies if c not in kept]
        handler = receiver._receiver._handler
        ranges: list[Any] = []
        settle = handler.settle_messages_async

        async def counted(delivery_id: Any, *args: Any, **kwargs: Any) -> Any:
            ranges.append(delivery_id)
            return await settle(delivery_id, *args, **kwargs)

        handler.settle_messages_async = counted
        await receiver.complete_many(done[::-1])  # any order: sorted into runs
        first = copies[0]._delivery_id
        assert ranges == [(first + a, first + b) for a, b in ((0, 2), (4, 16), (19, 29), (31, 39))]
        assert all(c._settled for c in done) and not any(c._settled for c in kept)
        assert emu.namespace("primary").message_count(queue) == 4
        await receiver.complete_many(kept)
        assert emu.namespace("primary").message_count(queue) == 0
        await receiver.complete_many([])


async def test_complete_many_falls_back_to_one_at_a_time_when_a_range_is_refused(
    emu: Emulator, helper_client: SyncClient
) -> None:
    async with AsyncExitStack() as stack:
        receiver, queue, copies = await _received(stack, emu, helper_client, 5)
        handler = receiver._receiver._handler
        settle = handler.settle_messages_async

        async def refusing_ranges(delivery_id: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(delivery_id, tuple):
                raise ValueError("a range the link does not know")
            return await settle(delivery_id, *args, **kwargs)

        handler.settle_messages_async = refusing_ranges
        await receiver.complete_many(copies)
        assert all(c._settled for c in copies)
        assert emu.namespace("primary").message_count(queue) == 0
