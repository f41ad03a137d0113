"""GeoSender passive over partitioned queues in both regions, with a fragment down."""

from __future__ import annotations

import asyncio
import zlib

import pytest
from _helpers import drain_all_ids, on_emulator, queue_fixture
from azure.servicebus import ServiceBusMessage

from georep import FailoverPolicy, GeoReceiver, GeoSender, InvalidMessageError
from georep.adapters.emulator import Emulator
from georep.testing import InMemorySeenSet

pytestmark = pytest.mark.integration

DOWN = 3  # the primary's fragment taken down


def key_in_fragment(fragment: int, avoid: bool = False) -> str:
    """A partition key the emulator routes to ``fragment`` (crc32 mod 16), or away from it."""
    for index in range(10_000):
        key = f"key-{index}"
        if (zlib.crc32(key.encode()) % 16 == fragment) != avoid:
            return key
    raise AssertionError("no key found")


queue = queue_fixture("part", enable_partitioning=True)


async def test_unkeyed_sends_need_no_failover_and_keyed_ones_fail_over(
    emu: Emulator, queue: str
) -> None:
    await asyncio.to_thread(emu.namespace("primary").fragment_down, queue, DOWN)
    async with on_emulator(
        GeoSender, emu, queue, partitioned=True, policy=FailoverPolicy(attempt_timeout=20)
    ) as sender:
        unkeyed = [await sender.send_messages(ServiceBusMessage(f"u{i}")) for i in range(40)]
        assert all(r.accepted == ("primary",) and not r.failed_over for r in unkeyed)

        elsewhere = key_in_fragment(DOWN, avoid=True)
        keyed_up = await sender.send_messages(ServiceBusMessage("k", partition_key=elsewhere))
        assert keyed_up.accepted == ("primary",)

        keyed_down = await sender.send_messages(
            ServiceBusMessage("k", partition_key=key_in_fragment(DOWN))
        )
        assert keyed_down.failed_over and keyed_down.accepted == ("secondary",)

        # Both messages of a session must agree: refused before anything is sent.
        mismatch = ServiceBusMessage("m", partition_key="p")
        mismatch.session_id = "s"
        with pytest.raises(InvalidMessageError, match="partition_key"):
            await sender.send_messages(mismatch)

        # A batch of create_message_batch is checked as its messages are added and as a
        # whole when sent: one mixing partition keys is refused before anything is sent.
        batch = await sender.create_message_batch()
        batch.add_message(ServiceBusMessage("b1", partition_key=elsewhere))
        batch.add_message(ServiceBusMessage("b2", partition_key=key_in_fragment(DOWN)))
        with pytest.raises(InvalidMessageError, match="one partition key"):
            await sender.send_messages(batch)

    sent = [r.message_ids[0] for r in [*unkeyed, keyed_up, keyed_down]]

    # Peeking loops past the one-fragment-at-a-time answers of a partitioned entity.
    async with on_emulator(GeoReceiver, emu, queue, seen=InMemorySeenSet()) as receiver:
        peeked = await receiver.peek_all(100)
    in_primary = emu.namespace("primary").message_count(queue)
    assert len(peeked["primary"]) == in_primary == 41
    assert len(peeked["secondary"]) == 1

    await asyncio.to_thread(emu.namespace("primary").fragment_up, queue, DOWN)
    stored = await drain_all_ids(emu, queue, known_count=False, wait=1)
    assert set(stored) == set(sent) and stored.total() == len(sent), "nothing lost"
