"""ServiceBusAdministrationClient (sync and async) against the emulator.

Over HTTPS, on the AMQP port.
"""

from __future__ import annotations

import datetime as dt

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


async def test_async_admin_queue_lifecycle_with_runtime_counts(georep_emulator: Emulator) -> None:
    async with georep_emulator.async_admin_client("secondary") as admin:
        await admin.create_queue(
            "admin-q",
            lock_duration=dt.timedelta(seconds=30),
            max_delivery_count=4,
            requires_duplicate_detection=True,
            dead_lettering_on_message_expiration=True,
        )
        with pytest.raises(ResourceExistsError):
            await admin.create_queue("admin-q")
        queue = await admin.get_queue("admin-q")
        assert queue.lock_duration == dt.timedelta(seconds=30)
        assert queue.max_delivery_count == 4
        assert queue.requires_duplicate_detection is True
        async with (
            ServiceBusClient.from_connection_string(
                georep_emulator.connection_string("secondary")
            ) as client,
            client.get_queue_sender("admin-q") as sender,
        ):
            await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        runtime = await admin.get_queue_runtime_properties("admin-q")
        assert runtime.active_message_count == 2
        assert runtime.total_message_count == 2
        names = [q.name async for q in admin.list_queues()]
        assert "admin-q" in names and "orders" in names
        queue.max_delivery_count = 7
        await admin.update_queue(queue)
        assert (await admin.get_queue("admin-q")).max_delivery_count == 7
        await admin.delete_queue("admin-q")
        with pytest.raises(ResourceNotFoundError):
            await admin.get_queue("admin-q")
    # The admin client created the queue where AMQP senders see it, and deleting it removed it.
    assert "admin-q" not in georep_emulator.namespace("secondary").entities()


def test_sync_admin_topics_and_subscriptions(georep_emulator: Emulator) -> None:
    with georep_emulator.admin_client("primary") as admin:
        admin.create_topic("admin-t")
        admin.create_subscription("admin-t", "s1", max_delivery_count=3)
        admin.create_subscription("admin-t", "s2")
        assert sorted(s.name for s in admin.list_subscriptions("admin-t")) == ["s1", "s2"]
        assert admin.get_subscription("admin-t", "s1").max_delivery_count == 3
        assert admin.get_topic_runtime_properties("admin-t").subscription_count == 2
        admin.delete_subscription("admin-t", "s2")
        assert [s.name for s in admin.list_subscriptions("admin-t")] == ["s1"]
        admin.delete_topic("admin-t")
        with pytest.raises(ResourceNotFoundError):
            admin.get_topic("admin-t")


def test_admin_with_the_wrong_key_is_refused(georep_emulator: Emulator) -> None:
    from azure.core.exceptions import ClientAuthenticationError
    from azure.servicebus.management import ServiceBusAdministrationClient

    conn = georep_emulator.connection_string("primary")
    key = conn.split("SharedAccessKey=")[1].split(";")[0]
    wrong = conn.replace(key, "d3Jvbmcta2V5")
    with (
        ServiceBusAdministrationClient.from_connection_string(
            wrong, connection_verify=str(georep_emulator.ca_file)
        ) as admin,
        pytest.raises(ClientAuthenticationError) as info,
    ):
        admin.get_queue("orders")
    assert key not in str(info.value)
