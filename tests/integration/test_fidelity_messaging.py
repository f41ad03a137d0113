"""Fidelity: sending, receiving and settling: rows of the
fidelity table in docs/emulator.md (see ``_fidelity.py``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest
from _fidelity import (
    bodies,
    check,
    checks_test,
    client_for,
    dead_lettered,
    make_queue,
    one_received,
    receive_all,
    send,
    unique_name,
)
from azure.servicebus import AutoLockRenewer, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient as AsyncClient

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


# -- sending --------------------------------------------------------------------------------
@check("Send one message or a list")
def _send_single_and_list(emu: Emulator) -> None:
    queue = make_queue(emu)
    with client_for(emu) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"one"))
            sender.send_messages([ServiceBusMessage(b"two"), ServiceBusMessage(b"three")])
        with client.get_queue_receiver(queue) as receiver:
            got = receive_all(receiver, 3)
            assert sorted(bodies(got)) == [b"one", b"three", b"two"]


@check("Send a `ServiceBusMessageBatch`")
def _send_batch(emu: Emulator) -> None:
    queue = make_queue(emu)
    with client_for(emu) as client:
        with client.get_queue_sender(queue) as sender:
            batch = sender.create_message_batch()
            for index in range(5):
                batch.add_message(ServiceBusMessage(f"m{index}"))
            sender.send_messages(batch)
        with client.get_queue_receiver(queue) as receiver:
            assert len(receive_all(receiver, 5)) == 5


@check("Schedule and cancel scheduled messages")
def _schedule(emu: Emulator) -> None:
    queue = make_queue(emu)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with client_for(emu) as client:
        with client.get_queue_sender(queue) as sender:
            first, second = sender.schedule_messages(
                [ServiceBusMessage(b"a"), ServiceBusMessage(b"b")], later
            )
            sender.cancel_scheduled_messages(first)
        with client.get_queue_receiver(queue) as receiver:
            peeked = receiver.peek_messages(max_message_count=10)
            assert [m.sequence_number for m in peeked] == [second]
            assert receiver.receive_messages(max_wait_time=0.3) == []


@check("Send to a topic: fan-out to every subscription")
def _topic_fan_out(emu: Emulator) -> None:
    topic = unique_name("t")
    emu.namespace("primary").create_topic(topic, ["a", "b"])
    with client_for(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(ServiceBusMessage(b"fan"))
        for subscription in ("a", "b"):
            with client.get_subscription_receiver(topic, subscription) as receiver:
                assert bodies(receive_all(receiver, 1)) == [b"fan"]


# -- receiving and settling -----------------------------------------------------------------
@check("Receive (PEEK_LOCK) and `complete_message`")
def _peek_lock_complete(emu: Emulator) -> None:
    with one_received(emu) as (queue, receiver, message):
        assert message.locked_until_utc is not None and message.delivery_count == 0
        receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=0.3) == []
    assert emu.namespace("primary").message_count(queue) == 0


@check("RECEIVE_AND_DELETE")
def _receive_and_delete(emu: Emulator) -> None:
    queue = make_queue(emu)
    send(emu, queue, ServiceBusMessage(b"x"))
    with client_for(emu) as client:
        receiver = client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        with receiver:
            assert bodies(receive_all(receiver, 1)) == [b"x"]
    assert emu.namespace("primary").message_count(queue) == 0


@check("`abandon_message`: redelivered with the delivery count raised")
def _abandon(emu: Emulator) -> None:
    with one_received(emu) as (_, receiver, message):
        receiver.abandon_message(message)
        [again] = receive_all(receiver, 1)
        assert again.sequence_number == message.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


@check("`dead_letter_message` and the dead-letter sub-queue")
def _dead_letter(emu: Emulator) -> None:
    with one_received(emu) as (queue, receiver, message):
        receiver.dead_letter_message(message, reason="bad", error_description="why")
    dead = dead_lettered(emu, queue)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("bad", "why")


@check("`defer_message` and `receive_deferred_messages`")
def _defer(emu: Emulator) -> None:
    with one_received(emu) as (_, receiver, message):
        receiver.defer_message(message)
        assert receiver.receive_messages(max_wait_time=0.3) == []
        [deferred] = receiver.receive_deferred_messages([message.sequence_number])
        assert bodies([deferred]) == [b"x"]
        receiver.complete_message(deferred)


@check("`renew_message_lock`")
def _renew_lock(emu: Emulator) -> None:
    with one_received(emu, lock_duration=30) as (_, receiver, message):
        before = message.locked_until_utc
        time.sleep(0.05)
        after = receiver.renew_message_lock(message)
        assert after > before
        receiver.complete_message(message)


@check("`peek_messages`")
def _peek(emu: Emulator) -> None:
    queue = make_queue(emu)
    send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(3)))
    with client_for(emu) as client, client.get_queue_receiver(queue) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert bodies(peeked) == [b"m0", b"m1", b"m2"]
    assert emu.namespace("primary").message_count(queue) == 3


@check("Lock expiry: the message is redelivered")
def _lock_expiry(emu: Emulator) -> None:
    with one_received(emu, lock_duration=1) as (_, receiver, message):
        [again] = receive_all(receiver, 1, within=5)
        assert again.sequence_number == message.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


@check("Max delivery count: dead-lettered `MaxDeliveryCountExceeded`")
def _max_delivery(emu: Emulator) -> None:
    with one_received(emu, max_delivery_count=2) as (queue, receiver, first):
        receiver.abandon_message(first)
        [second] = receive_all(receiver, 1)
        receiver.abandon_message(second)
        assert receiver.receive_messages(max_wait_time=0.3) == []
    assert dead_lettered(emu, queue).dead_letter_reason == "MaxDeliveryCountExceeded"


@check("Message time to live: expired messages dead-lettered `TTLExpiredException`")
def _ttl(emu: Emulator) -> None:
    queue = make_queue(emu, dead_lettering_on_message_expiration=True)
    send(emu, queue, ServiceBusMessage(b"x", time_to_live=dt.timedelta(seconds=1)))
    assert dead_lettered(emu, queue, within=6).dead_letter_reason == "TTLExpiredException"


@check("Duplicate detection")
def _duplicate_detection(emu: Emulator) -> None:
    queue = make_queue(emu, requires_duplicate_detection=True)
    send(emu, queue, ServiceBusMessage(b"1", message_id="same"))
    send(emu, queue, ServiceBusMessage(b"2", message_id="same"))
    assert emu.namespace("primary").message_count(queue) == 1


@check("Partitioned queues and topics")
def _partitioned(emu: Emulator) -> None:
    queue = make_queue(emu, enable_partitioning=True)
    send(emu, queue, *(ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(4)))
    with client_for(emu) as client, client.get_queue_receiver(queue) as receiver:
        assert len(receive_all(receiver, 4)) == 4


@check("Async client (`azure.servicebus.aio`)")
def _async_client(emu: Emulator) -> None:
    queue = make_queue(emu)

    async def run() -> list[bytes]:
        async with AsyncClient.from_connection_string(emu.connection_string("primary")) as sb:
            async with sb.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage(b"async"))
            async with sb.get_queue_receiver(queue) as receiver:
                got = await receiver.receive_messages(max_wait_time=5)
                for message in got:
                    await receiver.complete_message(message)
                return bodies(got)

    assert asyncio.run(run()) == [b"async"]


@check("`AutoLockRenewer` on messages")
def _auto_lock_renewer(emu: Emulator) -> None:
    # A 10 s lock, the messages registered as they are received (the receiver's
    # auto_lock_renewer): the SDK's renewer thread renews every half second, but with a
    # 5 s lock and the messages registered after all three arrived, it fell behind a lock
    # on a loaded machine (fresh-clone CI, 10 workers on two cores).
    queue = make_queue(emu, lock_duration=10)
    send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(3)))
    with (
        client_for(emu) as client,
        AutoLockRenewer(max_lock_renewal_duration=60) as renewer,
        client.get_queue_receiver(queue, auto_lock_renewer=renewer) as receiver,
    ):
        messages = receive_all(receiver, 3)
        first_lock = max(m.locked_until_utc for m in messages)
        # Until every first lock has run out: only renewal keeps them.
        while dt.datetime.now(dt.UTC) < first_lock + dt.timedelta(seconds=1):
            time.sleep(0.2)
        assert all(m.locked_until_utc > first_lock for m in messages), "renewed"
        for message in messages:
            receiver.complete_message(message)
    assert emu.namespace("primary").message_count(queue) == 0


@check("Concurrent settlement on one link (gathered `complete_message` and `renew_message_lock`)")
def _concurrent_settlement(emu: Emulator) -> None:
    queue = make_queue(emu)
    send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(10)))

    async def run() -> None:
        async with (
            AsyncClient.from_connection_string(emu.connection_string("primary")) as sb,
            sb.get_queue_receiver(queue) as receiver,
        ):
            got: list[Any] = []
            while len(got) < 10:
                got += await receiver.receive_messages(max_message_count=10, max_wait_time=2)
            await asyncio.gather(*(receiver.renew_message_lock(m) for m in got))
            await asyncio.gather(*(receiver.complete_message(m) for m in got))

    asyncio.run(run())
    assert emu.namespace("primary").message_count(queue) == 0


@check("Delivery count counts deliveries only (a message the SDK releases unseen is not counted)")
def _delivery_count_with_credit(emu: Emulator) -> None:
    queue = make_queue(emu)
    send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(5)))
    with client_for(emu) as client, client.get_queue_receiver(queue) as receiver:
        got = receive_all(receiver, 5)
        receiver.abandon_message(got[0])
        for message in got[1:]:
            receiver.complete_message(message)
        time.sleep(1)  # the abandoned message sits in the SDK's leftover credit meanwhile
        [again] = receive_all(receiver, 1)
        assert again.sequence_number == got[0].sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


test_supported_operation_works = checks_test(__name__)
