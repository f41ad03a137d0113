"""The real clock, and the deadlines georep puts on every call to a region.

Tests inject :class:`georep.testing.FakeClock`, whose deadlines run on virtual time
(its watchdog, ``georep.testing._clock.FakeWatchdog``, lives in the test kit).
"""

from __future__ import annotations

__all__ = ["Deadline", "SystemClock"]

import asyncio
import heapq
import itertools
import time
from types import TracebackType
from typing import Protocol


class _Watch(Protocol):
    def add(self, deadline: Deadline) -> None: ...


class Deadline:
    """``with`` body bounded by a deadline; raises ``TimeoutError`` when it passes.

    A plain (synchronous) context manager: entering and leaving cost no await, which
    matters on the send path. The body is cancelled at the deadline, as with
    ``asyncio.timeout``, and a caller's own cancellation is never turned into a timeout.
    The object is also its watchdog's record of the call.
    """

    __slots__ = ("_watch", "cancelling", "done", "expired", "seconds", "task", "when")

    def __init__(self, watch: _Watch, seconds: float) -> None:
        self._watch = watch
        self.seconds = seconds
        self.when = 0.0
        self.done = False
        self.expired = False
        self.cancelling = 0
        self.task: asyncio.Task[object] | None = None

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a georep deadline needs a running task")
        self.task = task
        self.cancelling = task.cancelling()
        self._watch.add(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        self.done = True
        task = self.task
        if task is None:
            return None
        if self.expired:
            # Our cancellation, not the caller's: take it back and report a timeout, as
            # asyncio.timeout does (a caller's own cancel keeps its count and propagates).
            cancels = task.uncancel()
            if cancels <= self.cancelling:
                if exc_type is asyncio.CancelledError:
                    raise TimeoutError(f"no answer within {self.seconds:g} s") from exc
                return None
        elif task.cancelling() <= self.cancelling:
            return None
        # The caller was cancelled while the body ran, and the body did not end by it: it
        # swallowed the cancellation (Python 3.11's ``asyncio.wait_for``, which the SDK's
        # AMQP layer uses, returns a result that arrived with the cancellation). Raise it
        # here, whatever the body did: a cancelled call's outcome is unknown to its caller
        # either way, and a send retried with the same messages is deduplicated.
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            return None
        raise asyncio.CancelledError() from exc

    def expire(self) -> None:
        if not self.done and not self.expired and self.task is not None:
            self.expired = True
            self.task.cancel(msg="georep deadline")


class _Watchdog:
    """Cancels calls that outlive their deadline, with one timer per event loop.

    ``asyncio.timeout`` arms and cancels a timer handle per call, and the cancelled handles
    pile up in the loop's heap; on the send path that cost about 5 % of a raw SDK send. Here
    a call costs one heap push, and the single timer fires only when the earliest
    outstanding deadline passes (finished calls are dropped from the heap then).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = float("inf")

    def add(self, deadline: Deadline) -> None:
        when = deadline.when = self._loop.time() + deadline.seconds
        heapq.heappush(self._heap, (when, next(self._order), deadline))
        if when < self._timer_when:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_when = when
            self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_when = float("inf")
        now = self._loop.time()
        heap = self._heap
        while heap and (heap[0][2].done or heap[0][0] <= now):
            heapq.heappop(heap)[2].expire()
        if heap:
            self._timer_when = heap[0][0]
            self._timer = self._loop.call_at(self._timer_when, self._fire)


class SystemClock:
    """Time from the operating system and the running event loop."""

    def __init__(self) -> None:
        self._watchdog: _Watchdog | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def deadline(self, seconds: float) -> Deadline:
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._watchdog is None:
            self._loop, self._watchdog = loop, _Watchdog(loop)
        return Deadline(self._watchdog, seconds)
