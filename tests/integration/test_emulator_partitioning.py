"""Partitioned entities through the real azure-servicebus SDK (Standard tier semantics)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from georep.adapters.emulator import Emulator
from georep.adapters.emulator._broker import MAX_PARTITIONED_ENTITIES, fragment_of
from georep.exceptions import EmulatorError

pytestmark = pytest.mark.integration


def key_in(fragment: int, prefix: str = "k") -> str:
    """A key that the emulator places in ``fragment``."""
    return next(f"{prefix}{i}" for i in range(10_000) if fragment_of(f"{prefix}{i}") == fragment)


def new_name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(namespaces=("primary", "quota")) as emulator:
        yield emulator


def partitioned_queue(emu: Emulator, **properties: object) -> str:
    name = new_name()
    emu.namespace("primary").create_queue(name, enable_partitioning=True, **properties)
    return name


@pytest.fixture
def queue(emu: Emulator) -> str:
    """A new partitioned queue (16 fragments) on the module's emulator."""
    return partitioned_queue(emu)


async def test_fragment_down_fails_keyed_sends_and_skips_for_unkeyed(
    emu: Emulator, emu_client: ServiceBusClient, queue: str
) -> None:
    control = emu.namespace("primary")
    async with emu_client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("held", partition_key=key_in(2)))
        control.fragment_down(queue, 2)
        try:
            assert control.fragments_down() == {queue: [2]}
            with pytest.raises(OperationTimeoutError, match="partition 2"):
                await sender.send_messages(
                    ServiceBusMessage("keyed", partition_key=key_in(2)), timeout=5
                )
            with pytest.raises(OperationTimeoutError):
                await sender.send_messages(ServiceBusMessage("s", session_id=key_in(2, "s")))
            # Unkeyed messages go to fragments that are up; the entity stays available.
            await sender.send_messages([ServiceBusMessage(f"u{i}") for i in range(20)])
            await sender.send_messages(ServiceBusMessage("other", partition_key=key_in(3)))
            async with emu_client.get_queue_receiver(queue) as receiver:
                got = await receiver.receive_messages(max_message_count=50, max_wait_time=2)
                for message in got:
                    await receiver.complete_message(message)
                bodies = sorted(str(m) for m in got)
                assert "held" not in bodies and len(bodies) == 21
                control.fragment_up(queue, 2)
                again = await receiver.receive_messages(max_message_count=5, max_wait_time=2)
                assert [str(m) for m in again] == ["held"]
                await receiver.complete_message(again[0])
        finally:
            control.restore()
        await sender.send_messages(ServiceBusMessage("keyed", partition_key=key_in(2)))
        assert control.fragments_down() == {}


async def test_all_fragments_down_refuses_unkeyed_sends_until_restore(
    emu: Emulator, emu_client: ServiceBusClient, queue: str
) -> None:
    control = emu.namespace("primary")
    async with emu_client.get_queue_sender(queue) as sender:
        for index in range(16):
            control.fragment_down(queue, index)
        try:
            with pytest.raises(OperationTimeoutError):
                await sender.send_messages(ServiceBusMessage("x"))
        finally:
            control.restore()
        await sender.send_messages(ServiceBusMessage("x"))


def test_fragment_faults_refuse_non_partitioned_entities(emu: Emulator) -> None:
    name = new_name()
    emu.namespace("primary").create_queue(name)
    with pytest.raises(EmulatorError, match="not partitioned"):
        emu.namespace("primary").fragment_down(name, 0)
    with pytest.raises(EmulatorError, match="out of range"):
        emu.namespace("primary").fragment_down(partitioned_queue(emu), 16)


@pytest.mark.parametrize("partitioned", [True, False])
async def test_session_id_and_different_partition_key_is_invalid_operation(
    emu: Emulator, emu_client: ServiceBusClient, partitioned: bool
) -> None:
    name = new_name()
    emu.namespace("primary").create_queue(name, enable_partitioning=partitioned)
    message = ServiceBusMessage("x", partition_key="a")
    message.session_id = "b"  # the SDK checks only when partition_key is set last
    async with emu_client.get_queue_sender(name) as sender:
        with pytest.raises(ServiceBusError, match="SessionId 'b' and the PartitionKey 'a'") as err:
            await sender.send_messages(message)
        assert type(err.value) is ServiceBusError  # com.microsoft:invalid-operation, no subclass
    assert emu.namespace("primary").message_count(name) == 0


async def test_peek_returns_one_fragment_run_and_a_loop_gets_all(
    emu: Emulator, emu_client: ServiceBusClient, queue: str
) -> None:
    a, b = key_in(4, "a"), key_in(9, "b")
    keys = [a, a, a, b, b, a, b]
    async with emu_client.get_queue_sender(queue) as sender:
        for i, key in enumerate(keys):
            await sender.send_messages(ServiceBusMessage(f"m{i}", partition_key=key))
    async with emu_client.get_queue_receiver(queue) as receiver:
        first = await receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert [str(m) for m in first] == ["m0", "m1", "m2"]  # fewer than asked, more exist
        peeked = list(first)
        while True:
            start = peeked[-1].sequence_number + 1  # type: ignore[operator]
            page = await receiver.peek_messages(max_message_count=10, sequence_number=start)
            if not page:
                break
            peeked += page
    assert [str(m) for m in peeked] == [f"m{i}" for i in range(len(keys))]


async def test_duplicate_detection_is_per_fragment(
    emu: Emulator, emu_client: ServiceBusClient
) -> None:
    name = partitioned_queue(emu, requires_duplicate_detection=True)
    async with emu_client.get_queue_sender(name) as sender:
        await sender.send_messages(ServiceBusMessage("1", message_id="same"))
        await sender.send_messages(ServiceBusMessage("2", message_id="same"))  # dropped
        a, b = key_in(1, "a"), key_in(2, "b")
        await sender.send_messages(ServiceBusMessage("3", message_id="m", partition_key=a))
        await sender.send_messages(ServiceBusMessage("4", message_id="m", partition_key=b))
        await sender.send_messages(ServiceBusMessage("5", message_id="m", partition_key=a))
    async with emu_client.get_queue_receiver(name) as receiver:
        got = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
        assert sorted(str(m) for m in got) == ["1", "3", "4"]
        for message in got:
            await receiver.complete_message(message)


async def test_admin_reports_16x_size_and_refuses_partitioning_changes(emu: Emulator) -> None:
    name = new_name()
    async with emu.async_admin_client("primary") as admin:
        created = await admin.create_queue(
            name, enable_partitioning=True, max_size_in_megabytes=2048
        )
        assert created.max_size_in_megabytes == 2048 * 16
        queue = await admin.get_queue(name)
        assert queue.max_size_in_megabytes == 2048 * 16 and queue.enable_partitioning
        queue.max_delivery_count = 5
        await admin.update_queue(queue)  # sends back the 16x size it read: accepted
        updated = await admin.get_queue(name)
        assert updated.max_size_in_megabytes == 2048 * 16 and updated.max_delivery_count == 5
        updated.enable_partitioning = False
        with pytest.raises(HttpResponseError, match="enable_partitioning") as err:
            await admin.update_queue(updated)
        assert err.value.status_code == 400
        with pytest.raises(HttpResponseError, match="MaxSizeInMegabytes") as err:
            await admin.create_queue(
                new_name(), enable_partitioning=True, max_size_in_megabytes=6144
            )
        assert err.value.status_code == 400
        topic = await admin.create_topic(
            new_name(), enable_partitioning=True, max_size_in_megabytes=5120
        )
        assert topic.max_size_in_megabytes == 5120 * 16


async def test_the_101st_partitioned_entity_is_refused(emu: Emulator) -> None:
    control = emu.namespace("quota")
    for i in range(MAX_PARTITIONED_ENTITIES - 1):
        control.create_queue(f"q{i}", enable_partitioning=True)
    control.create_queue("plain")  # non-partitioned ones do not count
    async with emu.async_admin_client("quota") as admin:
        await admin.create_topic("t100", enable_partitioning=True)
        with pytest.raises(HttpResponseError, match="100 partitioned") as err:
            await admin.create_queue("q101", enable_partitioning=True)
        assert type(err.value) is HttpResponseError and err.value.status_code == 403
        with pytest.raises(HttpResponseError):
            await admin.create_topic("t101", enable_partitioning=True)
    with pytest.raises(EmulatorError, match="100 partitioned"):
        control.create_queue("q101", enable_partitioning=True)
    with pytest.raises(EmulatorError, match="100 partitioned"):
        control.create_topic("t101", enable_partitioning=True)
