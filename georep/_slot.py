"""One call at a time per region sender, without an await when the region is free."""

from __future__ import annotations

__all__ = ["RegionSlot", "holding"]

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class RegionSlot:
    """A FIFO mutex whose uncontended acquire is a plain call.

    ``asyncio.Lock`` costs three coroutine frames per ``async with`` even when free; every
    send takes this slot, so the free case must be cheap. Use it as::

        if not slot.try_acquire():
            await slot.acquire()
        try:
            ...
        finally:
            slot.release()
    """

    __slots__ = ("_busy", "_waiters")

    def __init__(self) -> None:
        self._busy = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def busy(self) -> bool:
        return self._busy

    def try_acquire(self) -> bool:
        """Take the slot if it is free and nobody is queued; never waits."""
        if self._busy or self._waiters:
            return False
        self._busy = True
        return True

    async def acquire(self) -> None:
        """Wait in line for the slot."""
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Handed the slot just as we were cancelled: pass it on.
                self.release()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            # else: a release() between our cancellation and now popped the cancelled
            # waiter already (and handed the slot to the next in line).
            raise

    def release(self) -> None:
        """Give the slot to the next in line (it stays busy), or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy = False


@contextlib.asynccontextmanager
async def holding(slot: RegionSlot) -> AsyncIterator[None]:
    """``async with holding(region.slot()):`` one call at a time on that region's sender."""
    if not slot.try_acquire():
        await slot.acquire()
    try:
        yield
    finally:
        slot.release()
