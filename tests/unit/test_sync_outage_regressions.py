"""Receivers that stopped processing after an outage, found running sync receivers through
the matrix (issue 14), pinned down on virtual time.

The receiver built by ``georep.sync.GeoReceiver.from_connection_strings`` runs the async
SDK on georep's loop thread: the stall below is the core's, for sync and async alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from georep import GeoReceiver
from georep._testing_seen import InMemorySeenSet
from georep.testing import FakeClock, FakeMessage, InMemoryRegionReceiver


class SwallowsCancellation(InMemorySeenSet):
    """A seen-set whose lease renewal swallows a cancellation that races its answer.

    Found with the async SDK, whose every frame read goes through ``asyncio.wait_for``: on
    Python 3.11 a ``wait_for`` whose inner call finished just as its task was cancelled
    returns the result and drops the cancellation. Any awaited dependency can do the
    same (a Redis client, an SDK renewal); the keep-alive must not depend on it.
    """

    swallowed = 0

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        try:
            await self._clock.sleep(0.5)  # the round trip
        except asyncio.CancelledError:
            self.swallowed += 1
        return await super().extend(keys, owner=owner, lease=lease)


async def test_a_renewal_that_swallows_its_cancellation_does_not_stall_the_region() -> None:
    clock = FakeClock()
    seen = SwallowsCancellation(clock=clock)
    # Locks of 2 s: the keep-alive renews every second while a handler runs.
    primary = InMemoryRegionReceiver("primary", "east", clock=clock, lock_duration=2.0)
    secondary = InMemoryRegionReceiver("secondary", "west", clock=clock)
    for message_id in ("a", "b", "c"):
        primary.put(FakeMessage(b"x", message_id))
    processed: list[str] = []

    async def handle(message: Any) -> None:
        # Ends while the keep-alive renews the claim (1.0 s .. 1.5 s).
        await clock.sleep(1.2)
        processed.append(message.message_id)

    receiver = GeoReceiver(
        primary, secondary, seen=seen, concurrency=1, max_wait=1.0, lease=30.0, clock=clock
    )
    running = asyncio.create_task(receiver.run(handle))
    await clock.advance(20)
    try:
        assert seen.swallowed >= 1, "the renewal swallowed the keep-alive's cancellation"
        assert processed == ["a", "b", "c"], "the region went on to the next copies"
        assert primary.pending == 0
    finally:
        closing = asyncio.create_task(receiver.aclose())
        await clock.advance(60)
        await asyncio.wait_for(asyncio.gather(closing, running), 1)
