"""Backlog queues created through the real admin client against the emulator."""

from __future__ import annotations

import uuid
import warnings
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from georep import PairedNamespaceOptions, backlog_queue_path
from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import ensure_backlog_queues, from_backlog, to_backlog

pytestmark = pytest.mark.integration


async def test_backlog_queues_are_created_once_and_others_left_alone(
    georep_emulator: Emulator,
) -> None:
    primary = f"ns{uuid.uuid4().hex[:6]}"
    options = PairedNamespaceOptions(backlog_queue_count=3)
    async with georep_emulator.async_admin_client("secondary") as admin:
        # An extra queue (index >= count) and a differing one exist beforehand.
        await admin.create_queue(backlog_queue_path(primary, 3))
        await admin.create_queue(
            backlog_queue_path(primary, 1), lock_duration=timedelta(seconds=30)
        )

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            paths = await ensure_backlog_queues(admin, primary, options)
            again = await ensure_backlog_queues(admin, primary, options)
        assert paths == again == [backlog_queue_path(primary, i) for i in range(3)]
        differing = [w for w in caught if "lock_duration" in str(w.message)]
        assert len(differing) == 1, "warned once about the differing queue"

        created = await admin.get_queue(paths[0])
        assert created.max_size_in_megabytes == 5120
        assert created.lock_duration == timedelta(minutes=1)
        assert created.dead_lettering_on_message_expiration is True
        assert created.max_delivery_count == 2**31 - 1
        assert (await admin.get_queue(paths[1])).lock_duration == timedelta(seconds=30)
        assert (await admin.get_queue(backlog_queue_path(primary, 3))).lock_duration is not None

    # A backlog queue carries messages for any entity; the aliases survive the trip.
    async with (
        ServiceBusClient.from_connection_string(
            georep_emulator.connection_string("secondary")
        ) as sb,
        sb.get_queue_sender(paths[0]) as sender,
        sb.get_queue_receiver(paths[0]) as receiver,
    ):
        await sender.send_messages(to_backlog(ServiceBusMessage("x", session_id="s"), "orders"))
        [received] = await receiver.receive_messages(max_wait_time=5)
        destination, restored = from_backlog(received)
        assert destination == "orders" and restored.session_id == "s"
        await receiver.complete_message(received)
