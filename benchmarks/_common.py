"""What several benchmarks share."""

from __future__ import annotations

from azure.servicebus import ServiceBusMessage

from georep import GeoSender, ReplicationMode
from georep.adapters.emulator import Emulator

BODY = b"x" * 200


async def fill_active(emu: Emulator, queue: str, count: int, body: bytes = BODY) -> None:
    """Send ``count`` logical messages with active replication: a copy in each region."""
    async with GeoSender.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        mode=ReplicationMode.ACTIVE,
    ) as sender:
        for start in range(0, count, 100):
            batch = await sender.create_message_batch()
            for _ in range(min(100, count - start)):
                batch.add_message(ServiceBusMessage(body))
            await sender.send_messages(batch)
