"""PairedSender through the real SDK: outage → backlog queues → ping → back to the primary."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from georep import PairedNamespaceOptions, PairedSender, RegionError, backlog_queue_path
from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import ensure_backlog_queues, from_backlog

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator() as emulator:
        yield emulator


async def back_on_primary(sender: PairedSender, within: float) -> bool:
    """Wait for the sender's background pinger to end failover."""
    deadline = time.monotonic() + within
    while sender.state.engaged:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def received(emu: Emulator, namespace: str, queue: str) -> list[ServiceBusMessage]:
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string(namespace)) as client,
        client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver,
    ):
        messages = []
        while batch := await receiver.receive_messages(max_message_count=50, max_wait_time=1):
            messages.extend(batch)
        return messages


async def test_outage_sends_go_to_backlog_queues_until_a_ping_succeeds(emu: Emulator) -> None:
    queue = f"paired-{uuid.uuid4().hex[:6]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)
    options = PairedNamespaceOptions(
        backlog_queue_count=2, failover_interval=1, ping_primary_interval=1, ping_timeout=5
    )
    primary_name = f"127.0.0.1:{emu.namespace('primary').port}"
    async with emu.async_admin_client("secondary") as admin:
        paths = await ensure_backlog_queues(admin, primary_name, options)
    assert paths == [backlog_queue_path(primary_name, i) for i in range(2)]

    async with PairedSender.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        options=options,
    ) as sender:
        assert await sender.send_messages(ServiceBusMessage("before")) == "primary"
        await asyncio.to_thread(emu.namespace("primary").outage)
        with pytest.raises(RegionError):
            await sender.send_messages(ServiceBusMessage("fails", session_id="s-1"))
        await asyncio.sleep(1.1)  # failover_interval passes with no successful send
        during = [ServiceBusMessage(f"during-{i}", session_id="s-1") for i in range(4)]
        places = [await sender.send_messages(m) for m in during]
        assert set(places) <= set(paths)

        await asyncio.to_thread(emu.namespace("primary").restore)
        assert await back_on_primary(sender, within=15)
        assert sender.pings >= 1
        assert await sender.send_messages(ServiceBusMessage("after")) == "primary"

    backlog = [m for path in paths for m in await received(emu, "secondary", path)]
    assert sorted(str(m.message_id) for m in backlog) == sorted(str(m.message_id) for m in during)
    for message in backlog:
        destination, restored = from_backlog(message)
        assert destination == queue and restored.session_id == "s-1"
    in_primary = [b"".join(m.body) for m in await received(emu, "primary", queue)]
    assert sorted(in_primary) == [b"after", b"before"], "pings are never delivered"
