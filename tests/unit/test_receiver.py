"""GeoReceiver's claim -> process -> commit protocol against in-memory regions and store."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from _receivers import ReceiverWorld

from georep import ClaimState, ConfigurationError, GeoReceiver, receiver
from georep._receiver import RECEIVE_GRACE
from georep.testing import FakeMessage

Handler = Callable[[Any], Awaitable[object]]


class World(ReceiverWorld):
    """Two regions, one seen-set, one clock; helpers to run a receiver for a while."""

    def __init__(self) -> None:
        super().__init__()
        self.primary, self.secondary = self.regions()
        self.processed: Counter[str] = Counter()

    def both(self, *ids: str) -> None:
        for message_id in ids:
            self.primary.put(FakeMessage(b"x", message_id))
            self.secondary.put(FakeMessage(b"x", message_id))

    def receiver(self, **options: Any) -> GeoReceiver:
        return self.geo(self.primary, self.secondary, **options)

    async def handler(self, message: Any) -> None:
        self.processed[message.message_id] += 1

    async def run_for(
        self, geo: GeoReceiver, seconds: float, handler: Handler | None = None
    ) -> None:
        task = asyncio.create_task(geo.run(handler or self.handler))
        await self.clock.advance(seconds)
        closing = asyncio.create_task(geo.aclose())
        await self.clock.advance(5)
        await asyncio.wait_for(closing, 1)
        await asyncio.wait_for(task, 1)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    yield World()


async def test_twins_are_processed_once_and_both_copies_settled(world: World) -> None:
    world.both("a", "b", "c")
    geo = world.receiver()
    await world.run_for(geo, 5)

    assert world.processed == Counter({"a": 1, "b": 1, "c": 1})
    assert len(world.primary.completed) == len(world.secondary.completed) == 3
    assert world.primary.pending == world.secondary.pending == 0
    assert geo.stats.processed == 3 and sum(geo.stats.suppressed.values()) == 3


async def test_copies_of_one_message_in_one_receive_turn_are_processed_once(
    world: World,
) -> None:
    # A replayed batch or a resend lands right behind the original: same region, same turn.
    for message_id in ("a", "b", "a", "a", "b"):
        world.primary.put(FakeMessage(b"x", message_id))
    geo = world.receiver()
    await world.run_for(geo, 5)

    assert world.processed == Counter({"a": 1, "b": 1})
    assert len(world.primary.completed) == 5 and world.primary.pending == 0
    assert geo.stats.suppressed == {"primary": 3}


async def test_a_repeat_in_the_turn_of_a_failed_copy_is_processed_after_it(
    world: World,
) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    world.primary.put(FakeMessage(b"x", "a"))
    calls: list[str] = []

    async def fails_first(message: Any) -> None:
        calls.append(message.message_id)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    await world.run_for(world.receiver(), 5, fails_first)
    assert calls == ["a", "a"], "the repeat was processed once the first copy was released"
    assert len(world.primary.completed) == 2 and world.primary.pending == 0


async def test_a_failing_handler_is_retried_on_redelivery_and_processed_once(
    world: World,
) -> None:
    world.primary.put(FakeMessage(b"x", "flaky"))
    calls = Counter[str]()

    async def flaky(message: Any) -> None:
        calls[message.message_id] += 1
        if calls[message.message_id] == 1:
            raise RuntimeError("first time fails")
        world.processed[message.message_id] += 1

    geo = world.receiver()
    await world.run_for(geo, 5, flaky)

    assert calls["flaky"] == 2 and world.processed["flaky"] == 1
    assert len(world.primary.abandoned) == 1 and len(world.primary.completed) == 1
    assert geo.stats.failed == 1


async def test_nothing_is_processed_while_the_store_is_down_and_nothing_is_lost(
    world: World,
) -> None:
    world.seen.unavailable = True
    world.both("a", "b")
    geo = world.receiver()
    task = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(20)
    assert world.processed == Counter() and geo.stats.store_errors > 0
    assert world.primary.pending == 2, "copies stay locked (renewed), not dropped"

    world.seen.unavailable = False
    await world.clock.advance(10)
    assert world.processed == Counter({"a": 1, "b": 1})
    assert world.primary.pending == world.secondary.pending == 0
    assert world.primary.dead_lettered == [] and world.primary.abandoned == []
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(5)
    await closing
    await task


async def test_opting_in_processes_unchecked_while_the_store_is_down(world: World) -> None:
    world.seen.unavailable = True
    world.both("a")
    geo = world.receiver(on_store_unavailable="process")
    await world.run_for(geo, 5)
    assert world.processed["a"] == 2, "without the store both copies are processed"
    assert geo.stats.unchecked == 2


async def test_a_copy_claimed_elsewhere_waits_for_that_outcome(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "k"))
    geo = world.receiver()
    key = geo.seen_key("k")
    assert await world.seen.claim([key], owner="other", lease=60) == [ClaimState.CLAIMED]
    task = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(5)
    assert world.processed == Counter() and geo.stats.parked == 1
    assert world.primary.pending == 1

    await world.seen.commit([key], owner="other")
    await world.clock.advance(5)
    assert world.processed == Counter(), "the other consumer processed it"
    assert world.primary.pending == 0 and geo.stats.suppressed == {"primary": 1}
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(5)
    await closing
    await task


async def test_a_released_or_expired_claim_elsewhere_is_claimed_again(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "k"))
    geo = world.receiver()
    await world.seen.claim([geo.seen_key("k")], owner="crashed", lease=8)
    await world.run_for(geo, 15)  # the crashed owner's lease expires after 8 s
    assert world.processed["k"] == 1 and world.primary.pending == 0


async def test_a_long_handler_keeps_its_lock_and_its_lease(world: World) -> None:
    world.primary.lock_duration = 4
    world.primary.put(FakeMessage(b"x", "slow"))
    geo = world.receiver(lease=3)

    async def slow(message: Any) -> None:
        await world.clock.sleep(20)  # far longer than the lock and the lease
        world.processed[message.message_id] += 1

    other = []

    async def competitor() -> None:
        for _ in range(20):
            await world.clock.sleep(1)
            key = geo.seen_key("slow")
            other.append((await world.seen.claim([key], owner="rival", lease=1))[0])

    rival = asyncio.create_task(competitor())
    await world.run_for(geo, 30, slow)
    await rival
    assert world.processed["slow"] == 1 and world.primary.abandoned == []
    assert len(world.primary.completed) == 1
    assert ClaimState.CLAIMED not in other[:19], "our lease was extended throughout"


async def test_the_decorator_keeps_the_function_callable(world: World) -> None:
    world.both("d")

    @receiver(primary=world.primary, secondary=world.secondary, seen=world.seen, clock=world.clock)
    async def handle(message: Any) -> None:
        await world.handler(message)

    await handle(FakeMessage(b"direct", "direct"))
    assert world.processed["direct"] == 1

    task = asyncio.create_task(handle.run())
    await world.clock.advance(5)
    assert world.processed["d"] == 1 and handle.stats.processed == 1
    closing = asyncio.create_task(handle.aclose())
    await world.clock.advance(5)
    await closing
    await task


def test_bad_settings_are_refused(world: World) -> None:
    for concurrency in (0, 2.5, True, "8"):
        with pytest.raises(ConfigurationError, match="concurrency"):
            world.receiver(concurrency=concurrency)
    with pytest.raises(ConfigurationError, match="on_store_unavailable"):
        world.receiver(on_store_unavailable="ignore")


async def test_process_spans_link_to_the_producer_and_settle_spans_mark_duplicates(
    world: World,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for region in (world.primary, world.secondary):
        region.put(FakeMessage(b"x", "t", application_properties={"traceparent": producer}))

    geo = world.receiver(tracer_provider=provider)
    await world.run_for(geo, 5)

    spans = exporter.get_finished_spans()
    [process] = [s for s in spans if s.name == "process orders"]
    settles = [s for s in spans if s.name == "settle orders"]
    assert process.kind is SpanKind.CONSUMER
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "servicebus"
    assert format(process.links[0].context.trace_id, "032x") == producer.split("-")[1]
    duplicates = sorted(bool((s.attributes or {})["georep.duplicate"]) for s in settles)
    assert duplicates == [False, True]
    provider.shutdown()


async def test_closing_while_the_store_is_down_hands_the_copies_back(world: World) -> None:
    world.seen.unavailable = True
    world.both("a")
    geo = world.receiver()
    task = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(10)
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(10)
    await asyncio.wait_for(closing, 1)
    await asyncio.wait_for(task, 1)
    assert world.processed == Counter()
    assert len(world.primary.abandoned) == len(world.secondary.abandoned) == 1
    assert world.primary.pending == world.secondary.pending == 1, "handed back, not lost"


async def test_a_receive_that_never_returns_neither_stalls_the_other_region_nor_aclose(
    world: World,
) -> None:
    """The SDK can wait forever on a lost link: georep bounds each receive itself."""
    hung = asyncio.Event()  # never set: this region's receive never returns

    async def never(max_messages: int, *, max_wait: float) -> list[Any]:
        await hung.wait()
        return []

    world.primary.receive = never  # type: ignore[method-assign]
    world.both("a", "b")
    geo = world.receiver()
    task = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(3)
    assert world.processed == Counter({"a": 1, "b": 1}), "the secondary went on"
    await world.clock.advance(1.0 + RECEIVE_GRACE)  # the hung receive hit its deadline
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(1.0 + RECEIVE_GRACE)
    await asyncio.wait_for(closing, 1)
    await asyncio.wait_for(task, 1)
