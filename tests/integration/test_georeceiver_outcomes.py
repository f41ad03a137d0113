"""GeoReceiver end to end, beyond one queue: topics, the handler's decisions, max_attempts,
pings. Real SDK, the two-region emulator, a real Redis seen-set."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from _helpers import (
    CountingHandler,
    drain,
    eventually,
    queue_fixture,
    run_until,
    sdk_sender,
    send_active,
    stored,
)
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from georep import GeoReceiver
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.servicebus import ServiceBusRegionReceiver

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")


queue = queue_fixture("rx", lock_duration=5, max_delivery_count=10)


@pytest.fixture
def topic(emu: Emulator) -> str:
    name = f"tp-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_topic(name, subscriptions=["billing", "shipping"])
    return name


async def send_to(emu: Emulator, region: str, queue: str, messages: list[Any]) -> None:
    """A plain SDK send to one region (the twin arriving there on its own)."""
    async with sdk_sender(emu.connection_string(region), queue) as sender:
        await sender.send_messages(messages)


async def dead_letters(emu: Emulator, region: str, queue: str) -> list[Any]:
    """Every message in the queue's dead-letter queue in ``region`` (received and deleted)."""
    return await drain(emu, region, queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)


def geo(emu: Emulator, seen: RedisSeenSet, **options: Any) -> GeoReceiver:
    return GeoReceiver.from_connection_strings(
        emu.connection_string("primary"), emu.connection_string("secondary"), seen=seen, **options
    )


# --------------------------------------------------------------------------------- topics


async def test_each_subscription_of_a_topic_processes_every_message_once(
    emu: Emulator, topic: str, seen: RedisSeenSet
) -> None:
    ids = await send_active(emu, 40, topic_name=topic)
    counts = {"billing": Counter[str](), "shipping": Counter[str]()}

    def handler(subscription: str) -> Any:
        async def handle(message: Any) -> None:
            counts[subscription][str(message.message_id)] += 1

        return handle

    receivers = {name: geo(emu, seen, topic_name=topic, subscription_name=name) for name in counts}
    tasks = [asyncio.create_task(r.run(handler(name))) for name, r in receivers.items()]
    paths = [f"{topic}/Subscriptions/{name}" for name in counts]
    drained = await eventually(lambda: all(stored(emu, p) == 0 for p in paths), within=60)
    await asyncio.gather(*(r.aclose() for r in receivers.values()))
    await asyncio.gather(*tasks)

    assert drained
    expected = Counter(dict.fromkeys(ids, 1))
    assert counts["billing"] == expected, "billing: every message once"
    assert counts["shipping"] == expected, "shipping: every message once (not taken as dupes)"


async def test_two_receivers_of_one_subscription_still_dedup(
    emu: Emulator, topic: str, seen: RedisSeenSet
) -> None:
    ids = await send_active(emu, 40, topic_name=topic)
    processed = CountingHandler()
    receivers = [geo(emu, seen, topic_name=topic, subscription_name="billing") for _ in range(2)]
    tasks = [asyncio.create_task(r.run(processed)) for r in receivers]
    path = f"{topic}/Subscriptions/billing"
    drained = await eventually(lambda: stored(emu, path) == 0, within=60)
    await asyncio.gather(*(r.aclose() for r in receivers))
    await asyncio.gather(*tasks)

    assert drained
    assert processed == Counter(dict.fromkeys(ids, 1))
    assert sum(sum(r.stats.suppressed.values()) for r in receivers) == 40


# ---------------------------------------------------------------------- the handler decides


async def test_a_message_dead_lettered_in_primary_is_dead_lettered_when_its_twin_arrives(
    emu: Emulator, queue: str, seen: RedisSeenSet
) -> None:
    ids = [f"order-{index}" for index in range(5)]
    await send_to(emu, "primary", queue, [ServiceBusMessage("x", message_id=i) for i in ids])
    handled: Counter[str] = Counter()

    first = geo(emu, seen, queue_name=queue)

    async def reject(message: Any) -> None:
        handled[str(message.message_id)] += 1
        await first.dead_letter_message(
            message, reason="invalid-order", error_description="no customer id"
        )

    await run_until(first, reject, lambda: first.stats.dead_lettered == 5)
    assert first.stats.processed == 0

    # The twins reach the secondary region later (e.g. it was unreachable meanwhile).
    await send_to(emu, "secondary", queue, [ServiceBusMessage("x", message_id=i) for i in ids])
    second = geo(emu, seen, queue_name=queue)

    async def must_not_run(message: Any) -> None:
        handled[str(message.message_id)] += 1

    await run_until(second, must_not_run, lambda: second.stats.dead_lettered == 5)

    assert handled == Counter(dict.fromkeys(ids, 1)), "the twins never reached a handler"
    primary = await dead_letters(emu, "primary", queue)
    secondary = await dead_letters(emu, "secondary", queue)
    assert sorted(str(m.message_id) for m in primary) == sorted(ids)
    assert {m.dead_letter_reason for m in primary} == {"invalid-order"}
    assert {m.dead_letter_error_description for m in primary} == {"no customer id"}
    assert sorted(str(m.message_id) for m in secondary) == sorted(ids)
    assert {m.dead_letter_reason for m in secondary} == {"georep:twin:invalid-order"}
    # The twins carry the original's description (their reason marks them as twins).
    assert {m.dead_letter_error_description for m in secondary} == {"no customer id"}


async def test_a_deferred_message_is_deferred_in_both_regions(
    emu: Emulator, queue: str, seen: RedisSeenSet
) -> None:
    ids = await send_active(emu, 6, queue_name=queue)
    handled: Counter[str] = Counter()
    receiver = geo(emu, seen, queue_name=queue)

    async def defer(message: Any) -> None:
        handled[str(message.message_id)] += 1
        await receiver.defer_message(message)

    await run_until(receiver, defer, lambda: receiver.stats.deferred == 12)

    assert handled == Counter(dict.fromkeys(ids, 1))
    for region in REGIONS:
        async with (
            ServiceBusClient.from_connection_string(emu.connection_string(region)) as client,
            client.get_queue_receiver(queue) as sdk,
        ):
            peeked = await sdk.peek_messages(max_message_count=50, sequence_number=0)
            numbers = [m.sequence_number for m in peeked]
            deferred = await sdk.receive_deferred_messages(numbers)
            assert sorted(str(m.message_id) for m in deferred) == sorted(ids), region
            for message in deferred:
                await sdk.complete_message(message)


async def test_a_message_failing_max_attempts_times_is_dead_lettered_in_both_regions(
    emu: Emulator, queue: str, seen: RedisSeenSet
) -> None:
    ids = await send_active(emu, 3, queue_name=queue)
    handled: Counter[str] = Counter()

    async def fails(message: Any) -> None:
        handled[str(message.message_id)] += 1
        raise RuntimeError("token=sekrit-value rejected")

    receiver = geo(emu, seen, queue_name=queue, max_attempts=3)
    await run_until(receiver, fails, lambda: stored(emu, queue) == receiver.stats.dead_lettered)

    assert receiver.stats.dead_lettered == 6
    # Attempts are the broker's delivery count of each copy (deliveries that never reached
    # the handler count too, as for the entity's MaxDeliveryCount): the first copy to reach
    # 3 is dead-lettered, its twin follows without running its handler to 3.
    assert all(1 <= handled[i] <= 2 * 3 for i in ids), handled
    assert receiver.stats.failed == sum(handled.values())
    reasons: dict[str, set[str]] = {i: set() for i in ids}
    for region in REGIONS:
        for message in await dead_letters(emu, region, queue):
            reasons[str(message.message_id)].add(str(message.dead_letter_reason))
            description = str(message.dead_letter_error_description)
            assert "sekrit" not in description, "an error's text may carry secrets"
            if message.dead_letter_reason == "georep:max-attempts":
                assert "RuntimeError" in description and "max_attempts=3" in description
    assert reasons == {i: {"georep:max-attempts", "georep:twin:georep:max-attempts"} for i in ids}


async def test_the_sdk_adapter_reads_the_content_type_pings_are_recognised_by(
    emu: Emulator, queue: str
) -> None:
    message = ServiceBusMessage("{}", message_id="typed", content_type="application/json")
    await send_to(emu, "primary", queue, [message])
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client,
        client.get_queue_receiver(queue) as sdk,
    ):
        [received] = await sdk.receive_messages(max_message_count=1, max_wait_time=5)
        region = ServiceBusRegionReceiver(sdk, region="primary")
        delivery = region.delivery(received, "message_id", None)
        assert (delivery.key, delivery.content_type) == ("typed", "application/json")
        await region.defer(received)
        [again] = await sdk.receive_deferred_messages([received.sequence_number])
        assert again.message_id == "typed", "defer() deferred it"
        await sdk.complete_message(again)
