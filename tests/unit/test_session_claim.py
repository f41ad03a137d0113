"""Two drop-in session receivers that find the same next available session at once, each
in a different region: the seen-set claim gives it to one, the other takes the next."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from azure.servicebus.exceptions import OperationTimeoutError

from georep.servicebus.aio._session import SessionOwnership, accept_in_both
from georep.testing import FakeClock, InMemorySeenSet

_T = TypeVar("_T")


@dataclass
class Region:
    """One region's session queue: sessions handed out in order, a lock per session."""

    region: str
    sessions: list[str]
    locks: set[str] = field(default_factory=set)
    namespace: str = "ns"
    entity: str = "carts"
    released: asyncio.Event = field(default_factory=asyncio.Event)
    refused: asyncio.Event = field(default_factory=asyncio.Event)

    async def accept(self, session_id: str | None, *, max_wait: float) -> Held | None:
        await asyncio.sleep(0)
        if session_id is None:
            session_id = next((s for s in self.sessions if s not in self.locks), None)
            if session_id is None:
                return None
        elif session_id in self.locks:
            self.refused.set()
            return None
        self.locks.add(session_id)
        return Held(self, session_id)


@dataclass
class Held:
    region: Region
    session_id: str

    async def close(self) -> None:
        self.region.locks.discard(self.session_id)
        self.region.released.set()


async def drive(clock: FakeClock, coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` while virtual time moves on (at most a minute)."""
    task = asyncio.ensure_future(coroutine)
    for _ in range(1200):
        if task.done():
            break
        await clock.advance(0.05)
    return await asyncio.wait_for(task, 1)


async def test_the_second_claimant_lets_go_and_takes_the_next_session() -> None:
    clock = FakeClock()
    primary, secondary = Region("primary", ["s1", "s2"]), Region("secondary", ["s1", "s2"])
    seen = InMemorySeenSet(clock=clock)
    winner = SessionOwnership(seen, "carts")
    assert await winner.claim("s1")
    secondary.locks.add("s1")  # the winner found s1 there, and locks the primary's next

    async def winner_locks_the_primary() -> None:
        await primary.released.wait()  # the loser lets go of it
        primary.locks.add("s1")

    loser = SessionOwnership(seen, "carts")
    winning: list[asyncio.Future[None]] = []

    async def loser_claim(session_id: str) -> bool:
        claimed = await loser.claim(session_id)
        if not claimed:
            winning.append(asyncio.ensure_future(winner_locks_the_primary()))
        return claimed

    # The loser found s1 first in the primary: its claim fails, it lets go and takes s2.
    chosen, held, errors = await drive(
        clock, accept_in_both([primary, secondary], None, 5.0, loser_claim, clock)
    )
    await asyncio.gather(*winning)
    assert winning, "the loser's claim failed"
    assert chosen == "s2" and errors == {}
    assert [h.session_id for h in held if h is not None] == ["s2", "s2"]
    assert primary.locks == secondary.locks == {"s1", "s2"}, "s1 is the winner's in both"
    await winner.release()
    assert await SessionOwnership(seen, "carts").claim("s1"), "released: free again"


async def test_the_winner_waits_a_moment_for_the_loser_to_let_go_in_the_other_region() -> None:
    clock = FakeClock()
    primary, secondary = Region("primary", ["s1"]), Region("secondary", ["s1"])
    secondary.locks.add("s1")  # the loser holds it there, for a moment

    async def loser_lets_go() -> None:
        await secondary.refused.wait()
        secondary.locks.discard("s1")

    letting_go = asyncio.ensure_future(loser_lets_go())
    claim = SessionOwnership(InMemorySeenSet(clock=clock), "carts").claim
    chosen, held, _ = await drive(
        clock, accept_in_both([primary, secondary], None, 5, claim, clock)
    )
    await letting_go
    assert chosen == "s1" and all(h is not None for h in held), "held in both regions"


async def test_no_session_but_the_one_another_receiver_holds_is_the_sdks_timeout() -> None:
    clock = FakeClock()
    primary, secondary = Region("primary", ["s1"]), Region("secondary", ["s1"])
    seen = InMemorySeenSet(clock=clock)
    assert await SessionOwnership(seen, "carts").claim("s1")
    claim = SessionOwnership(seen, "carts").claim
    with pytest.raises(OperationTimeoutError):
        await drive(clock, accept_in_both([primary, secondary], None, 1.0, claim, clock))
    assert primary.locks == secondary.locks == set(), "nothing kept locked"
