"""The drop-in client used the SDK's way at its edges: scheduled messages cancelled from
another process, AMQP annotated messages, partitioned entities, closing and cancelling at
awkward moments, the SDK's attributes. Each test names what an azure-servicebus program
does and checks that it does the same over two emulated regions."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

import pytest
from _helpers import REDIS_URL, start_child
from azure.servicebus import ServiceBusMessage

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")


def dropin(emu: Emulator, seen: RedisSeenSet, **options: Any) -> ServiceBusClient:
    """The one changed line (active mode unless told otherwise)."""
    options.setdefault("mode", ReplicationMode.ACTIVE)
    return ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"), emu.connection_string("secondary"), seen=seen, **options
    )


def scheduled(emu: Emulator, queue: str) -> dict[str, int]:
    """Scheduled messages of ``queue`` per region."""
    return {
        region: int(emu.namespace(region).entities()[queue]["scheduled_message_count"])
        for region in REGIONS
    }


_CANCEL_PROCESS = """
import asyncio, json, os
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

async def main():
    async with RedisSeenSet.from_url(os.environ["REDIS_URL"], group=os.environ["GROUP"]) as seen:
        client = ServiceBusClient.from_connection_strings(
            os.environ["PRIMARY"], os.environ["SECONDARY"], seen=seen
        )
        async with client, client.get_queue_sender(os.environ["QUEUE"]) as sender:
            await sender.cancel_scheduled_messages(json.loads(os.environ["NUMBERS"]))
    print("CANCELLED", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", [ReplicationMode.ACTIVE, ReplicationMode.PASSIVE])
async def test_a_schedule_is_cancelled_by_another_process_after_a_restart(
    emu: Emulator, private_queue: Any, mode: ReplicationMode
) -> None:
    queue = private_queue("sched")
    group = f"test-{uuid.uuid4().hex[:8]}"
    due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        dropin(emu, seen, mode=mode) as client,
        client.get_queue_sender(queue) as sender,
    ):
        numbers = await sender.schedule_messages(
            [ServiceBusMessage("cancel me"), ServiceBusMessage("me too")], due
        )
    # The process that scheduled them is gone; a new one cancels by the numbers alone.
    copies = 2 if mode is ReplicationMode.ACTIVE else 0
    assert scheduled(emu, queue) == {"primary": 2, "secondary": copies}
    child = await start_child(
        _CANCEL_PROCESS,
        emu,
        queue,
        REDIS_URL=REDIS_URL,
        GROUP=group,
        NUMBERS=json.dumps(numbers),
    )
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()[-3000:]
    assert out.decode().split() == ["CANCELLED"]
    # Nothing is scheduled any more in either region: no copy will ever be enqueued.
    assert scheduled(emu, queue) == {"primary": 0, "secondary": 0}
