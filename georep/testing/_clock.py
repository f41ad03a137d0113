"""Virtual time for tests: a clock that moves only when the test says so.

:class:`FakeClock` implements :class:`georep.ports.Clock`; its deadlines are the core's
:class:`~georep._clock.Deadline`, watched by :class:`FakeWatchdog` on virtual time.
"""

from __future__ import annotations

__all__ = ["FakeClock", "FakeWatchdog", "settle"]

import asyncio
import heapq
import itertools
from collections.abc import Callable

from georep._clock import Deadline


class FakeWatchdog:
    """Deadlines on virtual time, for :class:`georep.testing.FakeClock`."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.pending: list[Deadline] = []

    def add(self, deadline: Deadline) -> None:
        deadline.when = self._now() + deadline.seconds
        self.pending.append(deadline)

    def next_due(self) -> float | None:
        # An expired deadline is due no more: its task was cancelled, and one that
        # swallows the cancellation (and stays inside the deadline) must not make
        # advance() wake it again and again, for ever.
        self.pending = [d for d in self.pending if not d.done and not d.expired]
        return min((d.when for d in self.pending), default=None)

    def expire(self, now: float) -> None:
        for deadline in self.pending:
            if deadline.when <= now:
                deadline.expire()


class FakeClock:
    """A clock that stands still until :meth:`advance` moves it.

    ``sleep`` and ``deadline`` wait for virtual time, so a test drives a 10-second deadline
    in microseconds: start the operation as a task, then ``await clock.advance(10)``.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._epoch = start
        self._now = 0.0
        self._order = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._watchdog = FakeWatchdog(self.monotonic)

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._epoch + self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    def deadline(self, seconds: float) -> Deadline:
        return Deadline(self._watchdog, seconds)

    async def advance(self, seconds: float = 0.0) -> None:
        """Move time forward, waking every sleeper and deadline due on the way, in order."""
        target = self._now + seconds
        await settle()
        while True:
            due = [d for d, _, f in self._sleepers if not f.done()]
            deadline = self._watchdog.next_due()
            if deadline is not None:
                due.append(deadline)
            next_due = min((d for d in due if d <= target), default=None)
            if next_due is None:
                break
            self._now = max(self._now, next_due)
            while self._sleepers and self._sleepers[0][0] <= self._now:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            self._watchdog.expire(self._now)
            await settle()
        self._now = target
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let ready tasks run (no real time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
