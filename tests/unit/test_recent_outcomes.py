"""A GeoReceiver settles the twin of a message it committed itself without a claim round trip
(georep.receive.context.RecentOutcomes), and only while the seen-set surely still holds the
outcome."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from _receivers import CountingSeenSet, ReceiverWorld

from georep import ClaimState, GeoReceiver
from georep.receive.context import HeldHere, RecentOutcomes
from georep.testing import FakeClock, FakeMessage


class World(ReceiverWorld):
    def __init__(self, window: float = 600.0) -> None:
        super().__init__()
        self.seen = CountingSeenSet(window=window, clock=self.clock)
        self.primary, self.secondary = self.regions()
        self.geo = GeoReceiver(
            self.primary,
            self.secondary,
            seen=self.seen,
            clock=self.clock,
            max_wait=1.0,
            lease=10.0,
            dedup_scope="s",
        )
        self.calls: Counter[str] = Counter()

    async def twin_later(self, handler: Any = None, *, gap: float = 3.0) -> None:
        """Run the receiver: message "a" in the primary, its twin in the secondary ``gap``
        seconds later; then close it."""

        async def count(message: Any) -> None:
            self.calls[message.message_id] += 1

        task = asyncio.create_task(self.geo.run(handler or count))
        self.primary.put(FakeMessage(b"x", "a"))
        await self.clock.advance(gap)
        self.secondary.put(FakeMessage(b"x", "a"))
        await self.clock.advance(2)
        closing = asyncio.create_task(self.geo.aclose())
        await self.clock.advance(5)
        await asyncio.wait_for(closing, 1)
        await asyncio.wait_for(task, 1)


async def test_a_twin_of_a_message_this_receiver_committed_is_completed_without_a_claim() -> None:
    world = World()
    await world.twin_later()

    assert world.calls == Counter({"a": 1})
    assert len(world.primary.completed) == len(world.secondary.completed) == 1
    assert list(world.seen.claimed.values()) == [1]
    assert world.geo.stats.suppressed == {"secondary": 1}


async def test_a_twin_of_a_message_dead_lettered_here_gets_its_reason_without_a_claim() -> None:
    world = World()

    async def poison(message: Any) -> None:
        await world.geo.dead_letter_message(message, reason="bad")

    await world.twin_later(poison)

    [twin] = world.secondary.dead_lettered
    assert twin.dead_letter_reason == "georep:twin:bad"
    assert list(world.seen.claimed.values()) == [1]


async def test_a_twin_after_half_the_window_is_claimed_again() -> None:
    # Kept for half the window only: the store answers for the rest of it.
    world = World(window=10.0)
    await world.twin_later(gap=6)

    assert world.calls == Counter({"a": 1})  # the store still said DONE
    assert list(world.seen.claimed.values()) == [2]


async def test_a_deferred_outcome_is_not_remembered() -> None:
    # A deferred message is completed later: its twin must ask the store.
    world = World()

    async def defer(message: Any) -> None:
        await world.geo.defer_message(message)

    await world.twin_later(defer)

    assert len(world.secondary.deferred) == 1
    assert list(world.seen.claimed.values()) == [2]


def test_a_seen_set_without_a_window_gets_no_memory() -> None:
    recent = RecentOutcomes(FakeClock(), None)
    recent.add(["k"], ClaimState.DONE, None)
    assert not recent and recent.get("k") is None


def test_only_the_most_recent_keys_are_kept() -> None:
    recent = RecentOutcomes(FakeClock(), 600.0, limit=2)
    recent.add(["a", "b"], ClaimState.DONE, None)
    recent.add(["c"], ClaimState.DEAD_LETTERED, ["why"])
    assert recent.get("a") is None
    assert recent.get("b") == (ClaimState.DONE, None)
    assert recent.get("c") == (ClaimState.DEAD_LETTERED, "why")


async def test_held_here_wakes_the_waiters_of_a_key_when_its_holder_lets_it_go() -> None:
    held = HeldHere()
    held.hold(["k1", "k2"], "east")
    assert held.elsewhere("k1", "west") and not held.elsewhere("k1", "east")
    assert not held.elsewhere("k3", "west")

    loop = asyncio.get_running_loop()
    timed_out, waiting = loop.create_future(), loop.create_future()
    held.wake(["k1"], timed_out)
    timed_out.cancel()  # a wait that ran out: dropped at the next wait on the key
    held.wake(["k1", "k2"], waiting)
    held.release(["k1"], "west")  # not west's: nothing changes
    assert not waiting.done() and held.elsewhere("k1", "west")

    held.release(["k1"], "east")
    assert waiting.done() and not held.elsewhere("k1", "west")
    already = loop.create_future()
    held.wake(["k1"], already)  # let go before the wait began: at once
    assert already.done() and bool(held)
    held.release(["k2"], "east")
    assert not held
