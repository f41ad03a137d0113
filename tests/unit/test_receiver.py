"""GeoReceiver's claim -> process -> commit protocol against in-memory regions and store."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from _receivers import BulkRegion, RandomMessages, ReceiverWorld

from georep import ClaimState, ConfigurationError, GeoReceiver, receiver
from georep._lifecycle import STOP_TIMEOUT
from georep.receive.receiver import RECEIVE_GRACE
from georep.receive.region_loop import SETTLE_LINGER
from georep.testing import FakeMessage, InMemoryRegionReceiver, settle

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


async def test_a_plain_def_handler_runs_once_per_message(world: World) -> None:
    """``GeoReceiver.run`` given a plain ``def``: it returns None, which georep awaited, so
    the handler "failed" after its work was done, the message was abandoned and its work
    ran again on every redelivery until it was dead-lettered. Its return now means
    processed, as an ``async def``'s."""
    world.both("a", "b")
    geo = world.receiver()

    def handle(message: Any) -> None:
        world.processed[message.message_id] += 1

    await world.run_for(geo, 5, handle)  # type: ignore[arg-type]
    assert world.processed == Counter({"a": 1, "b": 1})
    assert len(world.primary.completed) == len(world.secondary.completed) == 2
    assert not world.primary.abandoned and geo.stats.processed == 2


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


@pytest.mark.parametrize("told", [True, False])
async def test_a_key_committed_by_its_owner_outside_the_receiver_is_no_lost_claim(
    world: World, told: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The Spark source commits a batch's ids itself while their handlers still wait; a
    lease renewal then finds them done. Told (record_outcomes), the receiver does not warn
    that another consumer may process them; and their twins need no claim."""
    world.primary.put(FakeMessage(b"x", "a"))
    geo = world.receiver(lease=3)
    claims_before_twin: list[int] = []  # claims made until the twin arrives

    async def committed_outside(message: Any) -> None:
        key = geo.seen_key(message.message_id)
        await world.seen.commit([key], owner=geo.owner)
        if told:
            geo.record_outcomes([key])
        await world.clock.sleep(4)  # the lease is renewed each second meanwhile
        claims_before_twin.append(sum(world.seen.claimed.values()))
        world.secondary.put(FakeMessage(b"x", "a"))

    await world.run_for(geo, 10, committed_outside)
    lost = "lost the claim on" in caplog.text
    assert lost != told
    assert len(world.secondary.completed) == 1, "the twin was settled as one"
    if told:
        assert sum(world.seen.claimed.values()) == claims_before_twin[0], "the twin took no claim"


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


# ------------------------------------------------------- run(), aclose() and their tasks


def other_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still running besides the test's own."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_aclose_cancels_only_its_own_tasks_and_is_bounded_by_a_stubborn_handler(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: aclose() cancelled the task that called run() (the caller's own), then
    waited without a bound; a handler that swallows cancellation hung aclose() for ever."""
    let_go = asyncio.Event()

    async def stubborn(message: Any) -> None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                continue

    world.primary.put(FakeMessage(b"x", "a"))
    geo = world.receiver()
    running = asyncio.create_task(geo.run(stubborn))
    await world.clock.advance(1)
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(geo.lease + geo.max_wait)  # the handlers' time is up
    await world.clock.advance(STOP_TIMEOUT)  # the cancelled loop did not end either
    assert closing.done(), "aclose() is bounded"
    assert running.done() and not running.cancelled(), "run()'s caller was not cancelled"
    assert "did not end within" in caplog.text
    let_go.set()
    await settle()


async def test_run_returns_only_once_the_receiver_is_closed(world: World) -> None:
    """Issue 31 (defect 4): run() returned while aclose() was still closing the clients,
    so an application that exits when run() returns cut the close short."""

    class SlowToClose(InMemoryRegionReceiver):
        async def close(self) -> None:
            await self.slow_clock.sleep(2)
            self.closed = True

    primary = SlowToClose("primary", "east", clock=world.clock)
    primary.slow_clock = world.clock  # type: ignore[attr-defined]
    geo = world.geo(primary, world.secondary)
    geo._owned.append(primary)
    running = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(1)
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(1.5)  # the loops stopped (their receives ended at t=2)...
    assert not primary.closed and not running.done()  # ...the client is still closing
    await world.clock.advance(2)
    assert primary.closed and closing.done()
    assert running.done() and running.exception() is None


async def test_a_failed_region_loop_stops_the_other_and_is_raised(world: World) -> None:
    """run() gathered the loops in the caller's task: one that raised left the other
    running, owned by nobody."""

    async def broken(max_messages: int, *, max_wait: float) -> list[Any]:
        raise RuntimeError("a bug in the region's receive")

    world.primary.receive = broken  # type: ignore[method-assign]
    geo = world.receiver()
    running = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(1)
    assert running.done()
    with pytest.raises(RuntimeError, match="a bug"):
        running.result()
    assert other_tasks() == []
    await geo.aclose()


async def test_cancelling_run_stops_the_loops_and_propagates(world: World) -> None:
    world.both("a")
    geo = world.receiver()
    running = asyncio.create_task(geo.run(world.handler))
    await world.clock.advance(1)
    running.cancel()
    await settle()
    assert running.cancelled() and other_tasks() == []
    await geo.aclose()


async def test_a_cancellation_while_the_lock_renewer_stops_is_not_swallowed(
    world: World,
) -> None:
    """The region loop stopped its renewer with ``cancel(); suppress(CancelledError):
    await``: a cancellation of the loop that arrived during that wait was swallowed, and
    the loop went on receiving for ever."""
    unwind = asyncio.Event()
    finish = asyncio.Event()

    async def slow_extend(keys: Any, *, owner: str, lease: float) -> list[bool]:
        try:
            await asyncio.Event().wait()
        finally:
            await unwind.wait()  # ends only once the test lets it
        return []

    async def handler(message: Any) -> None:
        await finish.wait()

    world.seen.extend = slow_extend  # type: ignore[method-assign]
    world.primary.put(FakeMessage(b"x", "a"))
    geo = world.receiver()
    running = asyncio.create_task(geo.run(handler))
    await world.clock.advance(4)  # the renewer is inside its extend call
    finish.set()
    await settle()  # the handler returned; the loop now waits for the renewer to end
    running.cancel()
    await settle()
    unwind.set()
    await settle()
    await world.clock.advance(1)
    assert running.done() and running.cancelled()
    assert other_tasks() == []
    await geo.aclose()


async def test_a_crashed_lock_renewer_is_logged_and_the_loop_goes_on(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewer's error came out of the turn when it was stopped, and ended the region
    loop (and run()) after the handler had long finished."""

    async def broken_extend(keys: Any, *, owner: str, lease: float) -> list[bool]:
        raise RuntimeError("a bug in the seen-set adapter")

    async def slow_handler(message: Any) -> None:
        await world.clock.sleep(5)
        world.processed[message.message_id] += 1

    world.seen.extend = broken_extend  # type: ignore[method-assign]
    world.primary.put(FakeMessage(b"x", "a"))
    geo = world.receiver()
    running = asyncio.create_task(geo.run(slow_handler))
    await world.clock.advance(6)
    assert "background task georep-renew primary ended with RuntimeError" in caplog.text
    world.primary.put(FakeMessage(b"x", "b"))
    await world.clock.advance(8)
    assert world.processed == Counter({"a": 1, "b": 1}) and not running.done()
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(5)
    await asyncio.wait_for(closing, 1)
    await asyncio.wait_for(running, 1)


async def test_a_twin_waits_for_its_sibling_region_without_asking_the_seen_set_again(
    world: World,
) -> None:
    # The handler holds message "a" for 5 s. Its copy in the other region belongs to this
    # receiver's own message in flight: it is not claimed again every parked turn (once a
    # second, before), and is settled by the next turn once the outcome is recorded.
    release = asyncio.Event()

    async def slow(message: Any) -> None:
        await release.wait()
        world.processed[message.message_id] += 1

    world.both("a")
    geo = world.receiver()
    task = asyncio.create_task(geo.run(slow))
    await world.clock.advance(5)
    assert geo.stats.parked == 1 and world.processed == Counter()
    release.set()
    await world.clock.advance(1)  # the loop's receive (max_wait 1 s), then its turn

    assert world.processed == Counter({"a": 1})
    assert world.primary.pending == world.secondary.pending == 0
    assert world.seen.claimed[geo.seen_key("a")] <= 2, world.seen.claimed
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(5)
    await closing
    await task


@pytest.mark.parametrize("seed", range(16))
async def test_random_handlers_process_each_message_once_and_leave_no_copy(
    world: World, seed: int
) -> None:
    """A seeded random run: messages in both regions or one, some arriving while it runs;
    a handler that takes a random (virtual) time and completes, fails (the copy comes
    again) or dead-letters at random. Each message reaches exactly one final outcome and
    neither region keeps a copy."""
    rng = random.Random(seed)
    messages = RandomMessages(rng, f"m{seed}", 30)
    ids = messages.ids
    messages.put_early(world.primary, world.secondary)
    geo = world.receiver(concurrency=rng.randint(1, 8), max_attempts=100)
    final: Counter[str] = Counter()
    failures = 0

    async def handler(message: Any) -> None:
        nonlocal failures
        await world.clock.sleep(rng.choice([0.0, 0.05, 0.3, 2.0]))
        roll = rng.random()
        if roll < 0.15:
            failures += 1
            raise RuntimeError("fails this time")
        if roll < 0.25:
            await geo.dead_letter_message(message, "bad", "random")
        final[message.message_id] += 1

    task = asyncio.create_task(geo.run(handler))
    for message_id in messages.late:
        await world.clock.advance(rng.choice([0.1, 0.5, 1.0]))
        messages.put(world.primary, world.secondary, message_id)
    for _ in range(120):
        if (
            sum(final.values()) == len(ids)
            and world.primary.pending == 0 == world.secondary.pending
        ):
            break
        await world.clock.advance(0.5)
    closing = asyncio.create_task(geo.aclose())
    await world.clock.advance(5)
    await asyncio.wait_for(closing, 1)
    await asyncio.wait_for(task, 1)

    assert final == Counter(ids), f"seed {seed}: each message one final outcome"
    assert world.primary.pending == world.secondary.pending == 0, f"seed {seed}: a copy left"
    # Each copy received once, plus once more per failure: none came again because its
    # lock ran out while it waited (a copy a loop forgot to keep).
    assert sum(geo.stats.received.values()) == messages.copies + failures, f"seed {seed}"


async def _twins_after_their_originals(world: World, count: int) -> tuple[BulkRegion, list[str]]:
    """A bulk-completing secondary; ``count`` messages processed from the primary, then
    their twins put in the secondary (found DONE, all in one turn)."""
    secondary = BulkRegion("secondary", "west", clock=world.clock)
    ids = [f"m{i}" for i in range(count)]
    for message_id in ids:
        world.primary.put(FakeMessage(b"x", message_id))
    await world.run_for(world.geo(world.primary, secondary), 3, world.handler)
    for message_id in ids:
        secondary.put(FakeMessage(b"x", message_id))
    return secondary, ids


async def test_a_turns_twins_are_completed_in_one_bulk_call_where_the_region_offers_it(
    world: World,
) -> None:
    secondary, ids = await _twins_after_their_originals(world, 6)
    geo = world.geo(world.primary, secondary)
    await world.run_for(geo, 3, world.handler)

    assert world.processed == Counter(dict.fromkeys(ids, 1))
    assert secondary.bulk_calls == [ids] and secondary.pending == 0
    assert geo.stats.suppressed == {"secondary": 6}


async def test_twins_whose_bulk_completion_failed_come_back_and_are_settled_then(
    world: World,
) -> None:
    secondary, ids = await _twins_after_their_originals(world, 4)
    secondary.refuse = True
    geo = world.geo(world.primary, secondary)
    await world.run_for(geo, 120, world.handler)  # past the copies' locks

    assert world.processed == Counter(dict.fromkeys(ids, 1))
    assert secondary.bulk_calls[0] == ids and secondary.bulk_calls[-1] == ids
    assert secondary.pending == 0


@pytest.mark.parametrize(
    ("finish_at", "calls"),
    [
        ({"a": 0.0, "b": 0.005, "c": 0.01}, [["a", "b", "c"]]),  # within the linger
        ({"a": 0.0, "b": 1.0, "c": 1.0}, [["b", "c"]]),  # a alone, a second earlier
    ],
    ids=["together", "apart"],
)
async def test_handlers_that_finish_within_the_settle_linger_are_completed_in_one_call(
    world: World, finish_at: dict[str, float], calls: list[list[str]]
) -> None:
    primary = BulkRegion("primary", "east", clock=world.clock)
    for message_id in finish_at:
        primary.put(FakeMessage(b"x", message_id))
    assert SETTLE_LINGER < 1.0

    async def handler(message: Any) -> None:
        await world.clock.sleep(finish_at[message.message_id])
        world.processed[message.message_id] += 1

    await world.run_for(world.geo(primary, world.secondary, concurrency=3), 3, handler)

    assert world.processed == Counter(dict.fromkeys(finish_at, 1))
    assert [sorted(call) for call in primary.bulk_calls] == calls and primary.pending == 0
    assert sorted(m.message_id for m in primary.completed) == sorted(finish_at)
