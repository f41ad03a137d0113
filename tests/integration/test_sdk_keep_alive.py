"""A dropped connection reaches georep without waiting for the SDK's keep-alive loop.

The SDK closes its AMQP handler after a connection error, before it retries, and closing
waits for the handler's keep-alive loop (a task or thread sleeping in one-second steps): up
to a second per failure before georep could fail over. georep's adapters let the SDK close
without that wait. Each test stands in a keep-alive loop that never ends, so a close that
still waited for it would hang: the send must fail over to georep's error within seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from _helpers import fault
from azure.servicebus import ServiceBusClient as SyncClient, ServiceBusMessage

from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import SyncServiceBusRegionSender, open_region_sender
from georep.exceptions import RegionUnavailableError

pytestmark = pytest.mark.integration


async def test_async_sender_reports_a_dropped_connection_without_the_keep_alive_wait(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("keepalive")
    region = open_region_sender(
        emu.connection_string("primary"), region="primary", queue_name=queue
    )
    try:
        await region.send(ServiceBusMessage(b"connected"), timeout=10)
        handler = region.sdk_sender._handler
        never_ends: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        handler._keep_alive_thread, real = never_ends, handler._keep_alive_thread
        real.cancel()
        await fault(emu, "primary", "outage")
        with pytest.raises(RegionUnavailableError):
            await asyncio.wait_for(region.send(ServiceBusMessage(b"x"), timeout=10), 8)
        assert not never_ends.done(), "the close did not wait for the keep-alive loop"
    finally:
        await region.close()


async def test_sync_sender_reports_a_dropped_connection_without_the_keep_alive_join(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("keepalive-sync")
    release = threading.Event()
    with SyncClient.from_connection_string(emu.connection_string("primary")) as client:
        sdk_sender = client.get_queue_sender(queue)
        region = SyncServiceBusRegionSender(sdk_sender, region="primary")
        try:
            await region.send(ServiceBusMessage(b"connected"), timeout=10)
            never_ends = threading.Thread(target=release.wait, daemon=True)
            never_ends.start()
            sdk_sender._handler._keep_alive_thread = never_ends
            await fault(emu, "primary", "outage")
            with pytest.raises(RegionUnavailableError):
                await asyncio.wait_for(region.send(ServiceBusMessage(b"x"), timeout=10), 8)
            assert never_ends.is_alive(), "the close did not join the keep-alive thread"
        finally:
            release.set()
            await region.close()
            sdk_sender.close()
