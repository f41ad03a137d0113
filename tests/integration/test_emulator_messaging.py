"""The emulator's messaging behaviour, through the real azure-servicebus SDK."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient as SyncClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import MessageLockLostError, MessageNotFoundError

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


def _utc_in(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


async def _drain(
    client: ServiceBusClient, queue: str, *, expect: int, wait: float = 2.0, **kwargs: object
) -> list:  # type: ignore[type-arg]
    received = []
    async with client.get_queue_receiver(queue, **kwargs) as receiver:  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(received) < expect and time.monotonic() < deadline:
            batch = await receiver.receive_messages(
                max_message_count=expect - len(received), max_wait_time=wait
            )
            for message in batch:
                if kwargs.get("receive_mode") != ServiceBusReceiveMode.RECEIVE_AND_DELETE:
                    await receiver.complete_message(message)
                received.append(message)
    return received


async def _send_one(client: ServiceBusClient, queue: str, message: ServiceBusMessage) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(message)


@contextlib.asynccontextmanager
async def _one_received(
    client: ServiceBusClient, queue: str, body: str
) -> AsyncIterator[tuple[Any, ServiceBusReceivedMessage]]:
    """Send one message with ``body`` to ``queue``, then receive it (locked): yields the
    receiver and the message."""
    await _send_one(client, queue, ServiceBusMessage(body))
    async with client.get_queue_receiver(queue) as receiver:
        [message] = await receiver.receive_messages(max_wait_time=5)
        yield receiver, message


async def test_every_message_field_round_trips(client: ServiceBusClient, queue: str) -> None:
    texts = ("message_id", "partition_key", "correlation_id", "subject", "to", "reply_to")
    fields: dict[str, Any] = {name: f"{name}-1" for name in texts}
    fields["content_type"] = "application/json"
    fields["time_to_live"] = dt.timedelta(minutes=5)
    fields["scheduled_enqueue_time_utc"] = _utc_in(-1).replace(microsecond=0)
    properties = {"color": "blue", "size": 3}
    await _send_one(
        client,
        queue,
        ServiceBusMessage(b"body-bytes", application_properties=properties, **fields),
    )
    async with client.get_queue_receiver(queue) as receiver:
        [got] = await receiver.receive_messages(max_wait_time=5)
        assert b"".join(got.body) == b"body-bytes"
        assert {name: getattr(got, name) for name in fields} == fields
        assert got.application_properties == {b"color": b"blue", b"size": 3}
        # Broker annotations
        assert got.sequence_number is not None and got.sequence_number > 0
        assert got.enqueued_time_utc is not None
        assert got.locked_until_utc is not None and got.locked_until_utc > dt.datetime.now(dt.UTC)
        assert got.delivery_count == 0
        await receiver.complete_message(got)


async def test_session_id_round_trips_through_peek(client: ServiceBusClient, queue: str) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("x", session_id="s-1"))
    async with client.get_queue_receiver(queue) as receiver:
        [peeked] = await receiver.peek_messages(max_message_count=1)
    assert peeked.session_id == "s-1"


async def test_send_single_list_and_batch(client: ServiceBusClient, queue: str) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("single"))
        await sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(3)])
        batch = await sender.create_message_batch()
        for i in range(5):
            batch.add_message(ServiceBusMessage(f"batch-{i}", message_id=f"b{i}"))
        await sender.send_messages(batch)
    received = await _drain(client, queue, expect=9)
    bodies = sorted(str(m) for m in received)
    assert bodies == sorted(
        ["single", *(f"list-{i}" for i in range(3)), *(f"batch-{i}" for i in range(5))]
    )
    assert {m.message_id for m in received if str(m).startswith("batch")} == {
        f"b{i}" for i in range(5)
    }
    sequence_numbers = [m.sequence_number for m in received]
    assert len(set(sequence_numbers)) == 9


def test_sync_sdk_send_and_receive(georep_emulator: Emulator, queue: str) -> None:
    with SyncClient.from_connection_string(
        georep_emulator.connection_string("secondary")
    ) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"sync-{i}") for i in range(3)])
        with client.get_queue_receiver(queue) as receiver:
            messages = receiver.receive_messages(max_message_count=3, max_wait_time=5)
            for message in messages:
                receiver.complete_message(message)
    assert sorted(str(m) for m in messages) == ["sync-0", "sync-1", "sync-2"]
    assert georep_emulator.namespace("secondary").message_count(queue) == 0


async def test_topic_fans_out_to_every_subscription(georep_emulator: Emulator) -> None:
    control = georep_emulator.namespace("primary")
    control.create_topic("fanout", subscriptions=("audit", "billing"))
    async with ServiceBusClient.from_connection_string(
        georep_emulator.connection_string("primary")
    ) as client:
        async with client.get_topic_sender("fanout") as sender:
            await sender.send_messages([ServiceBusMessage(f"e{i}") for i in range(3)])
        for subscription in ("audit", "billing"):
            async with client.get_subscription_receiver("fanout", subscription) as receiver:
                got = await receiver.receive_messages(max_message_count=3, max_wait_time=5)
                for message in got:
                    await receiver.complete_message(message)
            assert sorted(str(m) for m in got) == ["e0", "e1", "e2"]


async def test_dead_letter_with_reason_and_description(
    client: ServiceBusClient, queue: str
) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("poison", application_properties={"k": "v"}))
    async with client.get_queue_receiver(queue) as receiver:
        [message] = await receiver.receive_messages(max_wait_time=5)
        await receiver.dead_letter_message(
            message, reason="BadOrder", error_description="quantity < 0"
        )
    [dead] = await _drain(client, queue, expect=1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert str(dead) == "poison"
    assert dead.dead_letter_reason == "BadOrder"
    assert dead.dead_letter_error_description == "quantity < 0"
    assert dead.application_properties[b"k"] == b"v"


async def test_schedule_and_cancel(
    client: ServiceBusClient, queue: str, georep_emulator: Emulator
) -> None:
    async with client.get_queue_sender(queue) as sender:
        # Due in 10 s: the check below that nothing is due yet must come before it, and on
        # a loaded machine a 3 s margin ran out first (the message was already due).
        [kept] = await sender.schedule_messages(ServiceBusMessage("later"), _utc_in(10))
        [cancelled] = await sender.schedule_messages(ServiceBusMessage("never"), _utc_in(10))
        assert kept != cancelled
        await sender.cancel_scheduled_messages(cancelled)
    counts = georep_emulator.namespace("primary").entities()[queue]
    assert counts["scheduled_message_count"] == 1
    async with client.get_queue_receiver(queue) as receiver:
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        got = await receiver.receive_messages(max_message_count=5, max_wait_time=20)
        assert [str(m) for m in got] == ["later"]
        assert got[0].sequence_number == kept
        await receiver.complete_message(got[0])
        assert await receiver.receive_messages(max_wait_time=2) == []


async def test_cancelling_a_number_that_is_no_longer_scheduled_is_refused(
    georep_emulator: Emulator, queue: str
) -> None:
    """As the service: "Messages not found. Missing sequence numbers: N" for a number that
    is not a scheduled message (cancelled already); the others in the call are cancelled.
    (The SDK retries the refusal with its retry policy: none here.)"""
    connection = georep_emulator.connection_string("primary")
    async with (
        ServiceBusClient.from_connection_string(connection, retry_total=0) as client,
        client.get_queue_sender(queue) as sender,
    ):
        first, second = await sender.schedule_messages(
            [ServiceBusMessage("a"), ServiceBusMessage("b")], _utc_in(3600)
        )
        await sender.cancel_scheduled_messages(first)
        with pytest.raises(MessageNotFoundError, match=f"Missing sequence numbers: {first}'"):
            await sender.cancel_scheduled_messages([first, second])
    counts = georep_emulator.namespace("primary").entities()[queue]
    assert counts["scheduled_message_count"] == 0, "the one still scheduled was cancelled"


async def test_lock_expiry_redelivers_with_higher_delivery_count(
    client: ServiceBusClient, make_queue: Callable[..., str]
) -> None:
    async with _one_received(client, make_queue(lock_duration=1), "slow") as (receiver, first):
        assert first.delivery_count == 0
        await asyncio.sleep(1.3)  # let the 1 s lock expire
        [second] = await receiver.receive_messages(max_wait_time=5)
        assert second.message_id == first.message_id
        assert second.delivery_count == 1
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(first)
        await receiver.complete_message(second)


async def test_abandon_redelivers(client: ServiceBusClient, queue: str) -> None:
    async with _one_received(client, queue, "retry me") as (receiver, message):
        await receiver.abandon_message(message)
        [again] = await receiver.receive_messages(max_wait_time=5)
        assert again.message_id == message.message_id
        assert again.delivery_count == 1
        await receiver.complete_message(again)


async def test_max_delivery_count_moves_to_dead_letter(
    client: ServiceBusClient, make_queue: Callable[..., str]
) -> None:
    queue = make_queue(max_delivery_count=2)
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("cursed"))
    async with client.get_queue_receiver(queue) as receiver:
        for _ in range(2):
            [message] = await receiver.receive_messages(max_wait_time=5)
            await receiver.abandon_message(message)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
    [dead] = await _drain(client, queue, expect=1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


async def test_defer_then_receive_deferred_and_complete(
    client: ServiceBusClient, queue: str
) -> None:
    async with _one_received(client, queue, "later please") as (receiver, message):
        sequence_number = message.sequence_number
        await receiver.defer_message(message)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        [deferred] = await receiver.receive_deferred_messages([sequence_number])
        assert str(deferred) == "later please"
        assert deferred.lock_token is not None
        await receiver.complete_message(deferred)
        with pytest.raises(Exception, match=r"(?i)deferred|not.found"):
            await receiver.receive_deferred_messages([sequence_number])


async def test_renew_lock_extends_locked_until(
    client: ServiceBusClient, make_queue: Callable[..., str]
) -> None:
    queue = make_queue(lock_duration=2)
    async with _one_received(client, queue, "long job") as (receiver, message):
        before = message.locked_until_utc
        await asyncio.sleep(1.2)
        renewed = await receiver.renew_message_lock(message)
        assert renewed > before
        await asyncio.sleep(1.2)  # past the original lock, inside the renewed one
        await receiver.complete_message(message)


async def test_peek_does_not_lock_or_remove(client: ServiceBusClient, queue: str) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(4)])
    async with client.get_queue_receiver(queue) as receiver:
        peeked = await receiver.peek_messages(max_message_count=3)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2"]
        rest = await receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in rest] == ["p3"]
    assert len(await _drain(client, queue, expect=4)) == 4


async def test_peek_reports_each_message_state(client: ServiceBusClient, queue: str) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage("active"), ServiceBusMessage("deferred")])
        await sender.schedule_messages(ServiceBusMessage("scheduled"), _utc_in(600))
    async with client.get_queue_receiver(queue) as receiver:
        got = await receiver.receive_messages(max_message_count=2, max_wait_time=5)
        [to_defer] = [m for m in got if str(m) == "deferred"]
        await receiver.defer_message(to_defer)
        await receiver.abandon_message(next(m for m in got if str(m) == "active"))
    # A fresh receiver: the SDK peeks from the last sequence number a receiver received.
    async with client.get_queue_receiver(queue) as receiver:
        peeked = await receiver.peek_messages(max_message_count=10)
    assert {str(m): m.state for m in peeked} == {
        "active": ServiceBusMessageState.ACTIVE,
        "deferred": ServiceBusMessageState.DEFERRED,
        "scheduled": ServiceBusMessageState.SCHEDULED,
    }


async def test_receive_and_delete(
    client: ServiceBusClient, queue: str, georep_emulator: Emulator
) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"r{i}") for i in range(5)])
    got = await _drain(
        client, queue, expect=5, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    )
    assert sorted(str(m) for m in got) == [f"r{i}" for i in range(5)]
    assert georep_emulator.namespace("primary").message_count(queue) == 0


async def test_ttl_expiry_dead_letters_when_configured(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    dead_lettering = make_queue(dead_lettering_on_message_expiration=True)
    dropping = make_queue()
    for queue in (dead_lettering, dropping):
        async with client.get_queue_sender(queue) as sender:
            # The SDK sends whole seconds of time_to_live (0.5 s would become "no TTL").
            await sender.send_messages(
                ServiceBusMessage("short-lived", time_to_live=dt.timedelta(seconds=1))
            )
    await asyncio.sleep(1.3)
    counts = georep_emulator.namespace("primary").entities()
    assert counts[dead_lettering]["active_message_count"] == 0
    assert counts[dead_lettering]["dead_letter_message_count"] == 1
    assert counts[dropping]["total_message_count"] == 0
    [dead] = await _drain(
        client, dead_lettering, expect=1, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    )
    assert dead.dead_letter_reason == "TTLExpiredException"


async def test_duplicate_detection_drops_a_repeated_message_id(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = make_queue(
        requires_duplicate_detection=True, duplicate_detection_history_time_window=60
    )
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("first", message_id="same"))
        await sender.send_messages(
            ServiceBusMessage("second", message_id="same")
        )  # accepted, dropped
        await sender.send_messages(ServiceBusMessage("other", message_id="different"))
    assert georep_emulator.namespace("primary").message_count(queue) == 2
    got = await _drain(client, queue, expect=2)
    assert sorted(str(m) for m in got) == ["first", "other"]


async def test_ping_messages_are_accepted_but_never_delivered(
    client: ServiceBusClient, queue: str, georep_emulator: Emulator
) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(
            ServiceBusMessage(
                b"",
                content_type="application/vnd.ms-servicebus-ping",
                time_to_live=dt.timedelta(seconds=1),
            )
        )
        await sender.send_messages(ServiceBusMessage("real"))
    assert georep_emulator.namespace("primary").message_count(queue) == 1
    got = await _drain(client, queue, expect=2, wait=1)
    assert [str(m) for m in got] == ["real"]
