"""The system clock's deadlines: one watchdog timer per loop, asyncio.timeout semantics."""

from __future__ import annotations

import asyncio

import pytest

from georep._clock import SystemClock

# These tests use the real event-loop clock with deadlines of a few milliseconds: what they
# check is the interplay with real cancellation, which a fake clock cannot show.


async def test_a_call_past_its_deadline_raises_timeout_error() -> None:
    clock = SystemClock()
    with pytest.raises(TimeoutError), clock.deadline(0.01):
        await asyncio.Event().wait()


async def test_a_call_within_its_deadline_is_untouched_and_later_awaits_work() -> None:
    clock = SystemClock()
    for _ in range(100):
        with clock.deadline(0.05):
            await asyncio.sleep(0)
    await asyncio.sleep(0.07)  # past every deadline: no stray cancellation arrives
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_deadlines_fire_in_order_whatever_order_they_were_set() -> None:
    clock = SystemClock()
    finished: list[str] = []

    async def guarded(name: str, seconds: float) -> None:
        try:
            with clock.deadline(seconds):
                await asyncio.Event().wait()
        except TimeoutError:
            finished.append(name)

    await asyncio.gather(guarded("slow", 0.06), guarded("fast", 0.01), guarded("mid", 0.03))
    assert finished == ["fast", "mid", "slow"]


async def test_the_callers_own_cancellation_is_not_turned_into_a_timeout() -> None:
    clock = SystemClock()

    async def guarded() -> None:
        with clock.deadline(10):
            await asyncio.Event().wait()

    task = asyncio.create_task(guarded())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
