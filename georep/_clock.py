"""The real clock; tests inject :class:`georep.testing.FakeClock` instead."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import weakref
from types import TracebackType

__all__ = ["SystemClock"]


class _Deadline:
    """One guarded call: the task to cancel and when."""

    __slots__ = ("cancelling", "done", "expired", "task", "when")

    def __init__(self, task: asyncio.Task[object], when: float) -> None:
        self.task = task
        self.when = when
        self.done = False
        self.expired = False
        self.cancelling = task.cancelling()


class _Watchdog:
    """Cancels calls that outlive their deadline, with one timer per event loop.

    ``asyncio.timeout`` arms and cancels a timer handle per call, and the cancelled handles
    pile up in the loop's heap; on the send path that cost about 5 % of a raw SDK send. Here
    a call costs one heap push, and the single timer fires only when the earliest
    outstanding deadline passes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = float("inf")

    def add(self, seconds: float) -> _Deadline:
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("a georep deadline needs a running task")
        deadline = _Deadline(task, self._loop.time() + seconds)
        heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
        if deadline.when < self._timer_when:
            self._arm(deadline.when)
        return deadline

    def _arm(self, when: float) -> None:
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
            _, _, deadline = heapq.heappop(heap)
            if not deadline.done:
                deadline.expired = True
                deadline.task.cancel(msg="georep deadline")
        if heap:
            self._arm(heap[0][0])


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog] = (
    weakref.WeakKeyDictionary()
)


class _Timeout:
    """``async with`` body bounded by a deadline; raises ``TimeoutError`` when it passes."""

    __slots__ = ("_deadline", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._deadline: _Deadline | None = None

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        watchdog = _watchdogs.get(loop)
        if watchdog is None:
            watchdog = _watchdogs[loop] = _Watchdog(loop)
        self._deadline = watchdog.add(self._seconds)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        deadline = self._deadline
        assert deadline is not None
        deadline.done = True
        if deadline.expired:
            # Our cancellation, not the caller's: take it back and report a timeout, as
            # asyncio.timeout does (a caller's own cancel keeps its count and propagates).
            cancels = deadline.task.uncancel()
            if cancels <= deadline.cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError(f"no answer within {self._seconds:g} s") from exc
        return None


class SystemClock:
    """Time from the operating system and the running event loop."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> _Timeout:
        return _Timeout(seconds)
