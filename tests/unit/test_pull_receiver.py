"""PullReceiver (the drop-in client's receiver core) over in-memory regions and seen-set."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
from _receivers import BulkRegion, RandomMessages, ReceiverWorld
from azure.servicebus import exceptions as azure_exceptions
from azure.servicebus.exceptions import MessageAlreadySettled

from georep import ClaimState, ConfigurationError, SettlementError
from georep.exceptions import (
    AllRegionsUnavailableError,
    EntityNotFoundError,
    RegionUnavailableError,
)
from georep.ports import ErrorKind
from georep.receive.outcomes import ABANDON, COMPLETE, Decision, Settle, dead_letter_decision
from georep.receive.pull import (
    ABANDON_WAIT,
    IDLE_RETURN,
    KEEPING_UP,
    READ_AHEAD,
    SWEEP_AFTER,
    PullReceiver,
)
from georep.receive.region_loop import SETTLE_LINGER
from georep.testing import FakeMessage, InMemoryRegionReceiver

_T = TypeVar("_T")


class World(ReceiverWorld):
    def __init__(self) -> None:
        super().__init__()
        self.primary, self.secondary = self.regions()

    def both(self, *ids: str) -> None:
        for message_id in ids:
            self.primary.put(FakeMessage(b"x", message_id))
            self.secondary.put(FakeMessage(b"x", message_id))

    def pull(self, **options: Any) -> PullReceiver:
        options.setdefault("receiver_options", {"lease": 10.0})
        return PullReceiver(
            self.primary, self.secondary, seen=self.seen, clock=self.clock, **options
        )

    async def run(self, coroutine: Coroutine[Any, Any, _T], seconds: float = 3.0) -> _T:
        """Run ``coroutine`` while virtual time moves ``seconds`` (in small steps)."""
        task = asyncio.ensure_future(coroutine)
        for _ in range(int(seconds * 10)):
            if task.done():
                break
            await self.clock.advance(0.1)
        return await asyncio.wait_for(task, 1)

    async def close(self, pull: PullReceiver) -> None:
        await self.run(pull.aclose(), 30)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    yield World()


async def test_each_message_of_both_regions_is_handed_out_once(world: World) -> None:
    world.both("a", "b", "c")
    pull = world.pull()
    got = await world.run(pull.receive(10, 5))
    ids = [h.message.message_id for h in got]
    assert sorted(ids) == ["a", "b", "c"]
    for handout in got:
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    assert await world.run(pull.receive(10, 2)) == []
    await world.close(pull)

    # The twins were settled too: nothing is left in either region.
    assert world.primary.pending == world.secondary.pending == 0
    assert len(world.primary.completed) == len(world.secondary.completed) == 3


async def test_an_idle_receiver_sweeps_the_twins_of_what_it_completed(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    await world.clock.advance(2)  # the receives made while it was asked for have returned
    world.secondary.put(FakeMessage(b"x", "a"))  # the twin arrives after, nothing is asked
    await world.clock.advance(3)  # idle: the fetchers sweep

    assert world.primary.pending == world.secondary.pending == 0
    await world.close(pull)


async def test_no_region_is_browsed_for_twins_while_the_application_keeps_asking(
    world: World,
) -> None:
    for number in range(6):
        world.primary.put(FakeMessage(b"x", f"m{number}"))
    browses: Counter[str] = Counter()
    for region in (world.primary, world.secondary):
        browse = region.peek

        async def counted(count: int, browse: Any = browse, label: str = region.region) -> Any:
            browses[label] += 1
            return await browse(count)

        region.peek = counted  # type: ignore[method-assign]
    pull = world.pull()
    (first,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(first.message, COMPLETE, "complete_message"))
    browses.clear()
    # A program that settles each message and asks again half a second later: its fetchers
    # receive what it asks for, and browse nothing in between.
    for _ in range(5):
        await world.clock.advance(SWEEP_AFTER / 2)
        (handout,) = await world.run(pull.receive(1, 5))
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    assert browses == {}
    # It stops asking, and the twin of m0 arrives: the idle fetchers sweep it.
    world.secondary.put(FakeMessage(b"x", "m0"))
    await world.clock.advance(SWEEP_AFTER + pull.poll + 1)
    assert browses["secondary"] >= 1
    assert world.secondary.pending == 0
    await world.close(pull)


async def test_an_abandoned_message_is_handed_out_again(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (first,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(first.message, ABANDON, "abandon_message"))
    (second,) = await world.run(pull.receive(1, 5))
    assert second.message.message_id == "a" and second.message is not first.message
    await world.run(pull.settle(second.message, COMPLETE, "complete_message"))
    await world.close(pull)
    assert world.primary.pending == 0


async def test_dead_lettering_dead_letters_the_twin_too(world: World) -> None:
    world.both("a")
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    decision = dead_letter_decision("bad", "it was bad")
    await world.run(pull.settle(handout.message, decision, "dead_letter_message"))
    await world.clock.advance(3)
    await world.close(pull)

    reasons = sorted(
        str(m.dead_letter_reason)
        for m in world.primary.dead_lettered + world.secondary.dead_lettered
    )
    assert reasons == ["bad", "georep:twin:bad"]


async def test_settling_twice_or_a_foreign_message_is_refused(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    with pytest.raises(MessageAlreadySettled, match="complete_message"):  # as the SDK
        await pull.settle(handout.message, COMPLETE, "complete_message")
    with pytest.raises(SettlementError) as foreign:
        await pull.settle(object(), COMPLETE, "abandon_message")
    assert not isinstance(foreign.value, MessageAlreadySettled)
    await world.close(pull)


async def test_receive_and_delete_settles_on_hand_out(world: World) -> None:
    world.both("a", "b")
    pull = world.pull(receive_and_delete=True)
    got = await world.run(pull.receive(5, 5))
    assert sorted(h.message.message_id for h in got) == ["a", "b"]
    with pytest.raises(ConfigurationError, match="RECEIVE_AND_DELETE"):
        await pull.settle(got[0].message, COMPLETE, "complete_message")
    await world.clock.advance(3)
    await world.close(pull)
    assert world.primary.pending == world.secondary.pending == 0


async def test_closing_abandons_what_was_not_handed_out(world: World) -> None:
    for message_id in ("a", "b", "c"):
        world.primary.put(FakeMessage(b"x", message_id))
    pull = world.pull(prefetch=2)
    (handout,) = await world.run(pull.receive(1, 5))
    await world.clock.advance(1)  # the prefetch fills
    await world.close(pull)

    # Nothing completed; the held and prefetched messages are back in the queue.
    assert world.primary.completed == []
    assert world.primary.pending == 3
    assert handout.decided.result() is ABANDON


async def test_an_empty_receive_returns_after_its_wait(world: World) -> None:
    pull = world.pull()
    assert await world.run(pull.receive(1, 2), 5) == []
    await world.close(pull)


async def test_a_lock_is_renewed_on_request(world: World) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    before = handout.message.locked_until
    await world.clock.advance(1)
    expiry = await world.run(pull.renew_lock(handout.message))
    assert expiry is not None and expiry > before
    await world.close(pull)


async def test_ordered_reads_the_next_region_only_once_the_first_has_nothing(
    world: World,
) -> None:
    world.secondary.put(FakeMessage(b"x", "c"))  # the secondary's head, not in the primary
    world.both("a", "b")
    pull = world.pull(ordered=True)
    order = []
    for _ in range(3):
        (handout,) = await world.run(pull.receive(1, 5))
        order.append((handout.message.message_id, handout.region))
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    await world.close(pull)

    assert order == [("a", "primary"), ("b", "primary"), ("c", "secondary")]
    assert world.primary.pending == world.secondary.pending == 0


async def test_an_idle_sweep_passes_over_the_copies_it_holds_itself(world: World) -> None:
    # The secondary's copies of what was handed out from the primary are held (parked) by
    # this receiver; once the primary's are completed their keys are done, but a receive
    # passes over locked copies: counting them would receive (and hoard) the next ones.
    world.both("a", "b", "c", "d")
    pull = world.pull(poll=0.05)  # sweeping often: while the parked twins wait a turn
    got = await world.run(pull.receive(2, 5))
    await world.clock.advance(10)  # the program works on them; the twins wait, parked
    for handout in got:
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    await world.clock.advance(3)

    assert world.secondary.pending == 2 and pull.geo.stats.received["secondary"] == 2
    await world.close(pull)


async def test_a_completion_returns_before_its_outcome_is_recorded_and_settled(
    world: World,
) -> None:
    # As the SDK's complete_message sends its disposition without waiting for the broker's
    # answer: the region loop records the outcome, then settles the copy in its region.
    gate, release = asyncio.Event(), asyncio.Event()
    commit, completing = world.seen.commit, world.primary.complete

    async def slow_commit(keys: Any, **terms: Any) -> None:
        await gate.wait()
        await commit(keys, **terms)

    async def slow_complete(message: Any) -> None:
        await release.wait()
        await completing(message)

    world.seen.commit = slow_commit  # type: ignore[method-assign]
    world.primary.complete = slow_complete  # type: ignore[method-assign]
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    await asyncio.wait_for(pull.settle(handout.message, COMPLETE, "complete_message"), 1)

    key = pull.geo.seen_key("a")
    assert await world.seen.peek([key]) == [ClaimState.IN_FLIGHT]  # not recorded yet
    gate.set()
    await world.clock.advance(0.1)
    assert await world.seen.peek([key]) == [ClaimState.DONE]
    assert world.primary.completed == []  # recorded; still settling in its region
    release.set()
    await world.close(pull)
    assert len(world.primary.completed) == 1


async def test_closing_at_once_after_completions_records_and_settles_them(world: World) -> None:
    world.both("a", "b", "c")
    pull = world.pull()
    got = await world.run(pull.receive(3, 5))
    for handout in got:
        await pull.settle(handout.message, COMPLETE, "complete_message")
    await world.close(pull)

    keys = [pull.geo.seen_key(m) for m in "abc"]
    assert await world.seen.peek(keys) == [ClaimState.DONE] * 3
    assert world.primary.pending == world.secondary.pending == 0
    assert len(world.primary.completed) + len(world.secondary.completed) == 6


async def test_a_region_behind_with_twins_only_is_caught_up_without_being_asked(
    world: World,
) -> None:
    # The application took its messages from the primary; the secondary holds only their
    # twins. Once a receive there brought twins and nothing else, its fetcher goes on
    # receiving (and settling) them, twice as many each time: no copy is left waiting for
    # an idle sweep, and nothing is buffered that nobody asked for.
    world.primary.put(FakeMessage(b"x", "first"))
    pull = world.pull()
    (first,) = await world.run(pull.receive(1, 5))  # from here on, no sweep for a while
    await pull.settle(first.message, COMPLETE, "complete_message")
    await world.clock.advance(0.5)
    twins = [f"m{i}" for i in range(60)]
    for message_id in twins:
        await world.seen.commit([pull.geo.seen_key(message_id)], owner="x", outcome=ClaimState.DONE)
        world.secondary.put(FakeMessage(b"x", message_id))
    world.primary.put(FakeMessage(b"x", "second"))
    (second,) = await world.run(pull.receive(1, 5))
    await pull.settle(second.message, COMPLETE, "complete_message")
    await world.clock.advance(SWEEP_AFTER / 2)  # within it, no idle sweep has started

    assert world.secondary.pending == 0
    assert len(world.secondary.completed) == len(twins)
    assert len(pull._buffer) == 0, "nothing buffered that nobody asked for"
    await world.close(pull)


async def test_a_program_that_handled_everything_leaves_no_twin_for_an_idle_sweep(
    world: World,
) -> None:
    # The shape of benchmarks/dropin_receiver.py: batches received and completed one by
    # one until every message was handled, then nothing asked. The twins the program did
    # not see are settled as it goes and right after, not a second later by a sweep. (A
    # guard: these regions answer at once and do not fall behind as the emulator's did,
    # leaving twins for the sweep until the frontier sweep; the benchmark measures that.)
    ids = [f"m{i}" for i in range(60)]
    world.both(*ids)
    receiving = world.secondary.receive

    async def slow_receive(*args: Any, **kwargs: Any) -> Any:  # the region behind
        await world.clock.sleep(0.05)
        return await receiving(*args, **kwargs)

    world.secondary.receive = slow_receive  # type: ignore[method-assign]
    pull = world.pull()
    handled = 0
    while handled < len(ids):
        for handout in await world.run(pull.receive(10, 5)):
            handled += 1
            await pull.settle(handout.message, COMPLETE, "complete_message")
    await world.clock.advance(SWEEP_AFTER / 2)

    assert world.primary.pending == world.secondary.pending == 0
    await world.close(pull)


@pytest.mark.parametrize("delete", [False, True], ids=["peek-lock", "receive-and-delete"])
async def test_a_receive_cancelled_after_taking_a_message_hands_it_out_again(
    world: World, delete: bool
) -> None:
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull(receive_and_delete=delete)
    task = asyncio.ensure_future(pull.receive(10, 30))
    # The call takes "a", then waits a moment for more: it is cancelled there.
    for _ in range(300):
        if any(handout.handed_out for handout in pull._held.values()):
            break
        await world.clock.advance(0.01)
    assert not task.done(), "the call returned before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.primary.completed == [], "nothing settled for a call that returned nothing"

    (again,) = await world.run(pull.receive(1, 5))
    assert again.message.message_id == "a"
    if not delete:
        await world.run(pull.settle(again.message, COMPLETE, "complete_message"))
    await world.clock.advance(1)
    await world.close(pull)
    assert [m.message_id for m in world.primary.completed] == ["a"]


async def test_copies_handed_back_unseen_at_close_never_count_as_failed_attempts(
    world: World,
) -> None:
    """A program that opens a receiver, cancels its receive before a message reached it and
    closes, again and again (a worker restarted, a request timed out): the copies the
    receiver held go back each time, and are never dead-lettered as failed attempts, which
    the program never made."""
    world.both("a")
    for _ in range(5):
        pull = world.pull(receiver_options={"lease": 10.0, "max_attempts": 2})
        task = asyncio.ensure_future(pull.receive(10, 30))
        for _ in range(300):
            if any(handout.handed_out for handout in pull._held.values()):
                break
            await world.clock.advance(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await world.close(pull)
    assert world.primary.dead_lettered == world.secondary.dead_lettered == []

    pull = world.pull(receiver_options={"lease": 10.0, "max_attempts": 2})
    (handout,) = await world.run(pull.receive(1, 5))
    assert handout.message.message_id == "a"
    handed_back = len(world.primary.released) + len(world.secondary.released)
    assert handed_back > 2, "handed back more often than max_attempts"
    await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    await world.clock.advance(3)
    await world.close(pull)
    assert world.primary.pending == world.secondary.pending == 0


class Switchable(InMemoryRegionReceiver):
    """A fake region whose receives fail while it is ``down``."""

    down = False

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        if self.down:
            await self._clock.sleep(0.05)  # a refused connection answers at once
            raise RegionUnavailableError(
                f"{self.region} is down", region=self.region, kind=ErrorKind.CONNECTION
            )
        return await super().receive(max_messages, max_wait=max_wait)


async def test_a_receive_while_every_region_is_down_raises_as_the_sdks_does(
    world: World,
) -> None:
    """The SDK's receive_messages raises ServiceBusConnectionError when its namespace is
    down; with both regions down, so does a pull receiver (one region down: the other is
    read)."""
    world.primary = Switchable("primary", "east", clock=world.clock)
    world.secondary = Switchable("secondary", "west", clock=world.clock)
    world.secondary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    world.primary.down = True
    (handout,) = await world.run(pull.receive(1, 5))
    assert handout.message.message_id == "a", "one region down: the other is read"
    await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))

    world.secondary.down = True
    with pytest.raises(AllRegionsUnavailableError) as raised:
        await world.run(pull.receive(1, 5), 10)
    assert sorted(raised.value.causes) == ["primary", "secondary"]
    assert isinstance(raised.value, azure_exceptions.ServiceBusConnectionError)

    world.primary.down = world.secondary.down = False
    world.primary.put(FakeMessage(b"x", "b"))
    (again,) = await world.run(pull.receive(1, 10), 15)
    assert again.message.message_id == "b", "the regions are back: receiving resumes"
    await world.run(pull.settle(again.message, COMPLETE, "complete_message"))
    await world.close(pull)


async def test_a_long_wait_raises_once_both_regions_failed_not_when_it_ends(
    world: World,
) -> None:
    """The SDK's receive_messages(max_wait_time=60) raises once its namespace fails (after
    its retries), not a minute later: so does a pull receiver once each region failed
    twice during the call. A call that begins after the regions came back is not failed
    by what they answered before it."""
    world.primary = Switchable("primary", "east", clock=world.clock)
    world.secondary = Switchable("secondary", "west", clock=world.clock)
    pull = world.pull()
    world.primary.down = world.secondary.down = True
    started = world.clock.monotonic()
    with pytest.raises(AllRegionsUnavailableError):
        await world.run(pull.receive(1, 60), 61)
    assert world.clock.monotonic() - started < 5, "raised as the regions failed"

    world.primary.down = world.secondary.down = False
    world.primary.put(FakeMessage(b"x", "b"))
    (again,) = await world.run(pull.receive(1, 60), 61)
    assert again.message.message_id == "b"
    await world.run(pull.settle(again.message, COMPLETE, "complete_message"))
    await world.close(pull)


async def test_a_sweep_that_takes_a_message_nobody_asked_for_hands_it_back(
    world: World,
) -> None:
    """While idle, a receiver sweeps twins whose key is final at the head of a region. When
    such a twin is locked by another consumer, the sweep's receive takes the next copy
    instead, a message nobody asked for: it is handed back unseen (claim released, lock
    released, no delivery counted), not claimed and buffered. Three competing receivers
    each held 100 to 200 claims that way (benchmarks/competing_claims.py)."""
    world.primary.put(FakeMessage(b"x", "twin"))
    world.primary.put(FakeMessage(b"x", "fresh"))
    [locked] = await world.primary.receive(1, max_wait=0)  # another consumer holds it
    pull = world.pull()
    await world.seen.commit([pull.geo.seen_key("twin")], owner="other", outcome=ClaimState.DONE)
    pull._start_fetching()
    await world.clock.advance(5)  # idle: the fetchers sweep

    assert len(pull._buffer) == 0, "nothing buffered that nobody asked for"
    assert await world.seen.peek([pull.geo.seen_key("fresh")]) == [None], "claim released"
    (fresh,) = await world.run(pull.receive(1, 5), 10)
    assert fresh.message.message_id == "fresh"
    assert world.primary.abandoned == [] and world.primary.released, "released, not abandoned"
    await world.run(pull.settle(fresh.message, COMPLETE, "complete_message"))
    await world.primary.complete(locked)
    await world.close(pull)


class SlowToDefer(InMemoryRegionReceiver):
    """A fake region that takes two seconds to defer a copy."""

    async def defer(self, message: Any) -> None:
        await self._clock.sleep(2.0)
        await super().defer(message)


async def test_a_defer_returns_once_the_region_deferred_the_copy(world: World) -> None:
    """The SDK's defer_message returns once the broker deferred the message, and programs
    ask for it by number next: the drop-in receiver's defer waits for its region too (a
    completion returns once the seen-set has it)."""
    world.primary = SlowToDefer("primary", "east", clock=world.clock)
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(handout.message, Decision(Settle.DEFER), "defer", applied=True))
    assert [m.message_id for m in world.primary.deferred] == ["a"]
    await world.close(pull)


async def test_a_receive_asked_for_during_a_sweep_is_served_without_waiting_a_poll(
    world: World,
) -> None:
    """A fetcher that was sweeping (browsing its region's head) when the application asked
    for a message used to clear the request's wake-up as it began to idle, and wait out
    the poll interval (1 s) before receiving: an ``async for`` loop ran at a few messages
    a second."""
    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull(poll=5.0)
    (first,) = await world.run(pull.receive(1, 5))
    await world.run(pull.settle(first.message, COMPLETE, "complete_message"))
    browsing, release = asyncio.Event(), asyncio.Event()
    browse = world.primary.peek

    async def slow_browse(count: int) -> list[Any]:
        browsing.set()
        await release.wait()
        return await browse(count)

    world.primary.peek = slow_browse  # type: ignore[method-assign]
    for _ in range(60):  # the fetchers idle (at most a poll), then sweep
        if browsing.is_set():
            break
        await world.clock.advance(0.1)
    assert browsing.is_set(), "the primary's fetcher never swept"
    world.primary.put(FakeMessage(b"x", "b"))
    asked = asyncio.ensure_future(pull.receive(1, 30))
    for _ in range(5):
        await asyncio.sleep(0)  # the request reaches the fetchers while one browses
    release.set()
    for _ in range(10):  # one second of virtual time: a fifth of the poll
        if asked.done():
            break
        await world.clock.advance(0.1)
    assert asked.done(), "the request waited for the poll interval"
    (second,) = asked.result()
    assert second.message.message_id == "b"
    await world.run(pull.settle(second.message, COMPLETE, "complete_message"))
    await world.close(pull)


async def _take_one_by_one(world: World, pull: PullReceiver, count: int, gap: float) -> int:
    """Receive and complete ``count`` messages one call at a time, coming back ``gap``
    virtual seconds after each call returned; the most copies the primary had locked
    beyond the one the application held."""
    ahead = 0
    for _ in range(count):
        # Without moving virtual time: the fake regions and seen-set answer at once.
        (handout,) = await asyncio.wait_for(pull.receive(1, 5), 1)
        ahead = max(ahead, len(world.primary._locked) - 1)
        await asyncio.wait_for(pull.settle(handout.message, COMPLETE, "complete_message"), 1)
        await world.clock.advance(gap)
    return ahead


async def test_an_application_that_keeps_up_is_served_from_copies_read_ahead(
    world: World,
) -> None:
    for number in range(40):
        world.primary.put(FakeMessage(b"x", f"m{number}"))
    pull = world.pull()
    ahead = await _take_one_by_one(world, pull, 20, gap=0.0)
    # It grows while calls find the buffer empty: here the fake region answers at once, so
    # one copy ahead keeps up.
    assert 1 <= pull.read_ahead <= READ_AHEAD
    assert ahead >= 1, "copies were fetched ahead of the calls"
    # It slows down: the next call stops the read-ahead.
    await world.clock.advance(KEEPING_UP * 4)
    await _take_one_by_one(world, pull, 1, gap=0.0)
    assert pull.read_ahead == 0
    await world.close(pull)


async def test_copies_read_ahead_go_back_once_the_application_stops_asking(
    world: World,
) -> None:
    """A loop that kept up, then broke out with its receiver left open: what was read ahead
    goes back unseen (for other receivers) once nothing was asked for ``IDLE_RETURN``, and
    is not fetched again until the next call."""
    for number in range(40):
        world.primary.put(FakeMessage(b"x", f"m{number}"))
    pull = world.pull()
    await _take_one_by_one(world, pull, 20, gap=0.0)
    assert len(world.primary._locked) > 0, "copies were read ahead"
    receives = world.primary.receive
    calls = 0

    async def counted(max_messages: int, *, max_wait: float) -> list[Any]:
        nonlocal calls
        calls += 1
        return await receives(max_messages, max_wait=max_wait)

    world.primary.receive = counted  # type: ignore[method-assign]
    for _ in range(int(IDLE_RETURN * 10) + 30):  # the idle second, and two more
        await world.clock.advance(0.1)
    assert world.primary._locked == {}, "nothing is held back from other receivers"
    assert len(world.primary.released) >= 1 and calls == 0, "not fetched again meanwhile"
    counts = {m.message_id: m.delivery_count for m in world.primary._available}
    assert counts["m20"] == counts["m39"], "released unseen: counted as no delivery"
    (handout,) = await world.run(pull.receive(1, 5))  # the next call gets them, in order
    assert handout.message.message_id == "m20"
    await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
    await world.close(pull)


@pytest.mark.parametrize("regions", ["one", "both"])
async def test_an_abandoned_message_comes_back_before_those_read_ahead_behind_it(
    world: World, regions: str
) -> None:
    # As the SDK's receiver without prefetch: the abandoned message is at the head of its
    # region again, and the next receive gets it before the messages behind it, which an
    # application that keeps up had fetched ahead (and, with both regions, the other
    # region's copies). A session's order depends on it.
    names = [f"m{number}" for number in range(12)]
    for name in names:
        world.primary.put(FakeMessage(b"x", name))
    if regions == "both":
        for name in names:
            world.secondary.put(FakeMessage(b"x", name))
    pull = world.pull()
    order: list[str] = []
    ahead = 0
    for _ in range(len(names) + 2):
        got = await asyncio.wait_for(pull.receive(1, 0.5), 1)
        if not got:
            break
        ahead = max(ahead, len(world.primary._locked) - 1)
        (handout,) = got
        name = handout.message.message_id
        if name in ("m4", "m8") and f"abandoned {name}" not in order:
            order.append(f"abandoned {name}")
            # Virtual time moves in steps shorter than KEEPING_UP: the application keeps up.
            abandon = asyncio.ensure_future(
                pull.settle(handout.message, ABANDON, "abandon_message")
            )
            while not abandon.done():
                await world.clock.advance(KEEPING_UP / 5)
            await abandon
            continue
        order.append(name)
        await asyncio.wait_for(pull.settle(handout.message, COMPLETE, "complete_message"), 1)
    assert ahead >= 1, "copies were fetched ahead of the calls"
    expected = [*names[:4], "abandoned m4", *names[4:8], "abandoned m8", *names[8:]]
    assert order == expected
    await world.close(pull)
    assert world.primary.pending == world.secondary.pending == 0


async def test_an_abandon_its_region_does_not_answer_returns_after_its_bound(
    world: World,
) -> None:
    never = asyncio.Event()

    async def no_answer(message: Any) -> None:
        await never.wait()  # a blackhole: the abandon is never answered

    world.primary.put(FakeMessage(b"x", "a"))
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    world.primary.abandon = no_answer  # type: ignore[method-assign]
    began = world.clock.monotonic()
    await world.run(pull.settle(handout.message, ABANDON, "abandon_message"), 30)
    assert world.clock.monotonic() - began <= ABANDON_WAIT + 0.2
    never.set()
    await world.close(pull)


async def test_a_slow_application_holds_no_more_copies_than_it_asked_for(world: World) -> None:
    for number in range(10):
        world.primary.put(FakeMessage(b"x", f"m{number}"))
    pull = world.pull()
    assert await _take_one_by_one(world, pull, 6, gap=1.0) == 0
    assert pull.read_ahead == 0
    await world.close(pull)


async def test_a_twin_waits_for_its_sibling_region_without_asking_the_seen_set_again(
    world: World,
) -> None:
    # Both regions hold both copies; the application keeps the messages 3 s before it
    # completes them. The copy each region loop lost the claim race for is this receiver's
    # own message in flight: it waits for the sibling's outcome here instead of claiming
    # again every parked turn (three claims of a key per copy, before), and it is settled
    # within SETTLE_LINGER of that outcome (the twins decided meanwhile together), not
    # after a parked turn's pause (0.05 s and more).
    world.both("a", "b", "c")
    pull = world.pull()
    got = await world.run(pull.receive(3, 5))
    assert sorted(h.message.message_id for h in got) == ["a", "b", "c"]
    await world.clock.advance(3)
    for handout in got:
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"), 0)
    await world.clock.advance(SETTLE_LINGER)
    for _ in range(20):  # the twins' turns run
        await asyncio.sleep(0)

    assert world.primary.pending == world.secondary.pending == 0
    claimed = world.seen.claimed
    assert all(claimed[pull.geo.seen_key(m)] <= 2 for m in "abc"), claimed
    await world.close(pull)


async def test_two_concurrent_completions_of_one_message_settle_it_once(world: World) -> None:
    world.both("a")
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    gate = asyncio.Event()
    commit = world.seen.commit

    async def slow_commit(keys: Any, **terms: Any) -> None:
        await gate.wait()
        await commit(keys, **terms)

    world.seen.commit = slow_commit  # type: ignore[method-assign]
    first = asyncio.ensure_future(pull.settle(handout.message, COMPLETE, "complete_message"))
    await asyncio.sleep(0)  # the first is recording its decision now
    with pytest.raises(MessageAlreadySettled, match="complete_message"):
        await pull.settle(handout.message, COMPLETE, "complete_message")
    gate.set()
    await world.run(first)
    await world.clock.advance(2)
    await world.close(pull)
    assert len(world.primary.completed) == len(world.secondary.completed) == 1


async def test_a_completion_while_the_seen_set_is_down_is_recorded_once_it_is_back(
    world: World,
) -> None:
    world.both("a")
    pull = world.pull()
    (handout,) = await world.run(pull.receive(1, 5))
    world.seen.unavailable = True
    await asyncio.wait_for(pull.settle(handout.message, COMPLETE, "complete_message"), 1)
    await world.clock.advance(3)
    assert world.primary.completed == [], "not settled in its region before it is recorded"
    world.seen.unavailable = False
    await world.clock.advance(5)

    assert await world.seen.peek([pull.geo.seen_key("a")]) == [ClaimState.DONE]
    await world.clock.advance(2)
    await world.close(pull)
    assert world.primary.pending == world.secondary.pending == 0


@pytest.mark.parametrize("seed", range(24))
async def test_random_receives_and_settlements_hand_each_message_out_until_it_is_final(
    world: World, seed: int
) -> None:
    """A seeded random program: messages in both regions or in one (a failed copy), arriving
    while it runs; receive calls of random sizes; each message completed, dead-lettered or
    abandoned (handed out again later) at random, sometimes settled late, in random order.
    Then it drains. Each message gets exactly one final outcome from the program, and
    neither region keeps a copy."""
    rng = random.Random(seed)
    messages = RandomMessages(rng, f"m{seed}", 24)
    ids, late = messages.ids, list(messages.late)
    messages.put_early(world.primary, world.secondary)

    def put(message_id: str) -> None:
        messages.put(world.primary, world.secondary, message_id)

    pull = world.pull(receiver_options={"lease": 10.0, "max_attempts": 100})
    final: Counter[str] = Counter()
    held: list[Any] = []

    async def settle(handout: Any, ending: bool) -> None:
        roll = rng.random()
        message_id = handout.message.message_id
        if roll < 0.15 and not ending:
            await world.run(pull.settle(handout.message, ABANDON, "abandon_message"))
        elif roll < 0.25:
            decision = dead_letter_decision("bad", "random")
            await world.run(pull.settle(handout.message, decision, "dead_letter_message"))
            final[message_id] += 1
        else:
            await world.run(pull.settle(handout.message, COMPLETE, "complete_message"))
            final[message_id] += 1

    for _ in range(40):
        if late and rng.random() < 0.3:
            put(late.pop())
        got = await world.run(pull.receive(rng.randint(1, 6), rng.choice([0.2, 1.0])), 2)
        held += got
        rng.shuffle(held)
        keep = rng.randint(0, min(2, len(held)))  # some are settled on a later step
        while len(held) > keep:
            await settle(held.pop(), ending=False)
        await world.clock.advance(rng.choice([0.0, 0.1, 0.5]))
    for message_id in late:
        put(message_id)
    for handout in held:
        await settle(handout, ending=True)
    for _ in range(30):  # drain: complete whatever is still handed out
        got = await world.run(pull.receive(10, 1.0), 2)
        for handout in got:
            await settle(handout, ending=True)
        if not got and sum(final.values()) == len(ids):
            break
    await world.clock.advance(3)  # the last twins are swept
    await world.close(pull)

    assert final == Counter(ids), f"seed {seed}: each message one final outcome"
    for region in (world.primary, world.secondary):
        assert region.pending == 0, f"seed {seed}: {region.region} keeps a copy"


class _Opening:
    """A region receiver's ``open`` that ends when told to (or fails)."""

    def __init__(self) -> None:
        self.calls = 0
        self.outcome: asyncio.Future[BaseException | None] | None = None

    async def __call__(self) -> None:
        self.calls += 1
        self.outcome = asyncio.get_running_loop().create_future()
        error = await self.outcome
        if error is not None:
            raise error


def _with_open(region: InMemoryRegionReceiver) -> _Opening:
    opening = _Opening()
    region.open = opening  # type: ignore[attr-defined]
    return opening


async def _start_opening(
    world: World, wait: float | None = None
) -> tuple[_Opening, _Opening, PullReceiver, asyncio.Future[None]]:
    """Both regions' ``open`` held, and ``pull.open()`` started: the openings, the pull
    receiver and the call."""
    first, second = _with_open(world.primary), _with_open(world.secondary)
    pull = world.pull()
    opened = asyncio.ensure_future(pull.open() if wait is None else pull.open(wait=wait))
    for _ in range(5):  # a few loop turns: the opening tasks start
        await asyncio.sleep(0)
    return first, second, pull, opened


async def test_open_returns_once_one_region_is_open_and_the_other_goes_on_opening(
    world: World,
) -> None:
    first, second, pull, opened = await _start_opening(world)
    assert first.calls == second.calls == 1 and not opened.done()
    assert second.outcome is not None
    second.outcome.set_result(None)
    await asyncio.wait_for(opened, 1)
    assert first.outcome is not None and not first.outcome.done()  # still opening
    await pull.open()  # idempotent: not opened again
    assert first.calls == second.calls == 1
    first.outcome.set_result(None)
    world.both("a")
    (handout,) = await world.run(pull.receive(1, 5))
    assert handout.message.message_id == "a"
    await world.close(pull)


async def test_open_waits_at_most_its_bound_for_regions_that_do_not_answer(world: World) -> None:
    _, _, pull, opened = await _start_opening(world, wait=2.0)
    await world.clock.advance(1.9)
    assert not opened.done()
    await world.clock.advance(0.2)
    await asyncio.wait_for(opened, 1)
    await world.close(pull)  # stops the openings still running


async def test_open_raises_nothing_when_every_region_fails_to_open(world: World) -> None:
    first, second, pull, opened = await _start_opening(world)
    for region, opening in (("primary", first), ("secondary", second)):
        assert opening.outcome is not None
        opening.outcome.set_result(
            RegionUnavailableError("down", region=region, kind=ErrorKind.CONNECTION)
        )
    await asyncio.wait_for(opened, 1)
    await world.close(pull)


async def test_open_raises_the_refusal_when_every_region_refuses_the_entity(
    world: World,
) -> None:
    # As the SDK's receiver raises when its link cannot attach to an entity that does not
    # exist: both regions refused the receiver's own settings.
    first, second, pull, opened = await _start_opening(world)
    for region, opening in (("primary", first), ("secondary", second)):
        assert opening.outcome is not None
        opening.outcome.set_result(
            EntityNotFoundError("no such queue", region=region, kind=ErrorKind.ENTITY_NOT_FOUND)
        )
    with pytest.raises(EntityNotFoundError) as raised:
        await asyncio.wait_for(opened, 1)
    assert raised.value.region == "primary"
    await world.close(pull)


def _bulk_world(world: World) -> tuple[BulkRegion, BulkRegion]:
    world.primary = BulkRegion("primary", "east", clock=world.clock)
    world.secondary = BulkRegion("secondary", "west", clock=world.clock)
    return world.primary, world.secondary


async def test_messages_completed_one_at_a_time_reach_each_region_in_one_call(
    world: World,
) -> None:
    # The program completes one message at a time (each call returns once the seen-set
    # recorded it); what it completes within SETTLE_LINGER goes to its region in one
    # complete_many call (one disposition), and so do the twins in the other region.
    regions = _bulk_world(world)
    ids = ["a", "b", "c", "d", "e"]
    world.both(*ids)
    pull = world.pull()
    got = await world.run(pull.receive(5, 5))
    assert sorted(h.message.message_id for h in got) == ids
    for handout in got:
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"), 0)
    await world.clock.advance(SETTLE_LINGER)
    for _ in range(20):
        await asyncio.sleep(0)

    for region in regions:
        assert sorted(m for call in region.bulk_calls for m in call) == ids and region.pending == 0
        assert len(region.bulk_calls) <= 2, region.bulk_calls  # the originals, the twins
    await world.close(pull)


async def test_a_refused_bulk_completion_leaves_copies_that_get_their_outcome_later(
    world: World,
) -> None:
    # The region refuses the bulk call (its link dropped): the copies stay there, locked
    # until their locks run out, then come back and are completed as already done; the
    # program is never handed them again.
    primary, secondary = _bulk_world(world)
    world.both("a", "b", "c")
    primary.refuse = secondary.refuse = True
    pull = world.pull()
    got = await world.run(pull.receive(3, 5))
    for handout in got:
        await world.run(pull.settle(handout.message, COMPLETE, "complete_message"), 0)
    again = await world.run(pull.receive(3, 60), 70)  # past the copies' locks (30 s)

    assert again == []
    assert primary.pending == secondary.pending == 0
    assert len(primary.completed) == len(secondary.completed) == 3
    await world.close(pull)
