"""The real clock; tests inject :class:`georep.testing.FakeClock` instead."""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager

__all__ = ["SystemClock"]


class SystemClock:
    """Time from the operating system and the running event loop."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        # asyncio.timeout re-arms the current task instead of spawning one (wait_for does),
        # which matters on the send path where every microsecond is the caller's.
        return asyncio.timeout(seconds)
