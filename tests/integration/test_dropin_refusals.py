"""A drop-in receiver whose settings a region refuses (an entity it lacks, a key it does not
accept), or whose regions are both down, raises what the SDK's receiver raises; with one
region refusing or down, it reads the other."""

from __future__ import annotations

import re
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

import georep.servicebus
from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")


def wrong_key(connection_string: str) -> str:
    return re.sub(r"SharedAccessKey=[^;]+", "SharedAccessKey=d3Jvbmc=", connection_string)


def client_of(emu: Emulator, seen: RedisSeenSet, *, keys: Any = None) -> ServiceBusClient:
    strings = [emu.connection_string(region) for region in REGIONS]
    if keys is not None:
        strings = [keys(s) for s in strings]
    return ServiceBusClient.from_connection_strings(
        *strings, seen=seen, mode=ReplicationMode.ACTIVE
    )


async def test_receiving_from_an_entity_no_region_has_raises_the_sdks_not_found(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    async with client_of(emu, seen) as client:
        # As the SDK's: opening the receiver raises (its link cannot attach anywhere).
        with pytest.raises(MessagingEntityNotFoundError, match="'nope' could not be found"):
            async with client.get_queue_receiver("nope"):
                pass
        # A receiver used without opening it first raises at its first receive.
        receiver = client.get_queue_receiver("nope")
        with pytest.raises(MessagingEntityNotFoundError, match="'nope' could not be found"):
            await receiver.receive_messages(max_wait_time=30)
        with pytest.raises(ServiceBusError):  # again, and by the base class old code names
            async for _ in receiver:
                pass
        await receiver.close()


async def test_receiving_with_a_key_every_region_refuses_raises_the_sdks_auth_error(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    queue = private_queue("key")
    client = client_of(emu, seen, keys=wrong_key)
    async with client:
        with pytest.raises(ServiceBusAuthenticationError) as raised:
            async with client.get_queue_receiver(queue):  # raised as it opens, as the SDK's
                pass
        receiver = client.get_queue_receiver(queue)
        with pytest.raises(ServiceBusAuthenticationError):
            await receiver.receive_messages(max_wait_time=30)
        await receiver.close()
    assert "d3Jvbmc=" not in str(raised.value), "never the key"


def test_a_sync_receiver_raises_the_same(emu: Emulator, seen: RedisSeenSet) -> None:
    strings = [emu.connection_string(region) for region in REGIONS]
    with georep.servicebus.ServiceBusClient.from_connection_strings(*strings, seen=seen) as client:
        with pytest.raises(MessagingEntityNotFoundError), client.get_queue_receiver("nope"):
            pass  # raised as it opens, as the SDK's
        receiver = client.get_queue_receiver("nope")
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages(max_wait_time=30)
        receiver.close()


async def test_an_entity_one_region_lacks_is_read_from_the_other(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    emu.namespace("primary").create_queue("only-east")
    async with client_of(emu, seen) as client:
        async with client.get_queue_sender("only-east") as sender:
            await sender.send_messages(ServiceBusMessage("east"))  # active: one region took it
        async with client.get_queue_receiver("only-east") as receiver:
            got = await receiver.receive_messages(max_wait_time=30)
            assert [str(m) for m in got] == ["east"]
            await receiver.complete_message(got[0])


async def test_receiving_while_both_regions_are_down_raises_the_sdks_connection_error(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    queue = private_queue("down")
    async with client_of(emu, seen) as client, client.get_queue_receiver(queue) as receiver:
        for region in REGIONS:
            emu.namespace(region).outage()
        try:
            with pytest.raises(ServiceBusConnectionError, match="no region could receive"):
                await receiver.receive_messages(max_wait_time=30)
        finally:
            for region in REGIONS:
                emu.namespace(region).restore()
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("back"))
        got = await receiver.receive_messages(max_wait_time=30)
        assert [str(m) for m in got] == ["back"], "the same receiver reads on once they are back"
        await receiver.complete_message(got[0])


@pytest.mark.parametrize(
    "session", [False, True], ids=["plain-on-session-queue", "session-on-plain-queue"]
)
async def test_a_receiver_of_the_wrong_kind_for_its_entity_raises_as_the_sdks(
    emu: Emulator, seen: RedisSeenSet, session: bool
) -> None:
    """The SDK raises at once (a ``ServiceBusError``, ``amqp:not-allowed``) for a receiver
    without a session on an entity that requires sessions, and for the reverse; georep
    raised its ``AllRegionsUnavailableError`` (or waited) for what every region refuses."""
    queue = f"kind-{'plain' if session else 'sessions'}"
    for region in REGIONS:
        emu.namespace(region).create_queue(queue, requires_session=not session)
    arguments = {"session_id": "cart-1"} if session else {}
    async with client_of(emu, seen) as client:
        with pytest.raises(ServiceBusError, match="session") as raised:
            async with client.get_queue_receiver(queue, max_wait_time=5, **arguments) as receiver:
                await receiver.receive_messages(max_wait_time=30)
    assert not isinstance(raised.value, ServiceBusConnectionError), "not an outage"
