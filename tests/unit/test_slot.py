"""RegionSlot: a FIFO mutex with a synchronous fast path."""

from __future__ import annotations

import asyncio

from georep._slot import RegionSlot
from georep.testing import settle


async def test_free_slot_is_taken_without_waiting_and_released() -> None:
    slot = RegionSlot()
    assert slot.try_acquire() and slot.busy
    assert not slot.try_acquire()
    slot.release()
    assert not slot.busy and slot.try_acquire()


async def test_waiters_are_served_in_order() -> None:
    slot = RegionSlot()
    assert slot.try_acquire()
    order: list[int] = []

    async def worker(index: int) -> None:
        await slot.acquire()
        order.append(index)
        slot.release()

    tasks = [asyncio.create_task(worker(i)) for i in range(5)]
    await settle()
    assert order == []
    slot.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4] and not slot.busy


async def held_with_two_waiters() -> tuple[RegionSlot, asyncio.Task[None], asyncio.Task[None]]:
    """A slot taken at once, and two tasks waiting for it, in this order."""
    slot = RegionSlot()
    assert slot.try_acquire()
    first = asyncio.create_task(slot.acquire())
    second = asyncio.create_task(slot.acquire())
    await settle()
    return slot, first, second


async def test_a_cancelled_waiter_neither_holds_nor_loses_the_slot() -> None:
    slot, cancelled, later = await held_with_two_waiters()
    cancelled.cancel()
    await settle()
    slot.release()
    await asyncio.wait_for(later, 1)
    assert slot.busy  # held by `later`
    slot.release()
    assert not slot.busy


async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    slot, first, second = await held_with_two_waiters()
    slot.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it runs
    await settle()
    assert second.done() and slot.busy
    slot.release()
    assert not slot.busy


async def test_a_waiter_cancelled_before_a_release_pops_it_raises_cancelled_error() -> None:
    """Issue 26: the release ran between the cancel and the waiter's wake-up, so the waiter
    was no longer queued; acquire raised ValueError ("not in deque") instead."""
    slot, cancelled, later = await held_with_two_waiters()
    cancelled.cancel()  # its future is cancelled now; the task runs later
    slot.release()  # pops the cancelled waiter, skips it, hands the slot to `later`
    await settle()
    assert cancelled.cancelled(), "acquire must end in CancelledError, nothing else"
    assert later.done() and slot.busy  # held by `later`, not leaked
    slot.release()
    assert not slot.busy


async def test_a_slot_handed_to_a_waiter_cancelled_then_is_passed_to_the_next_one() -> None:
    slot = RegionSlot()
    assert slot.try_acquire()
    waiters = [asyncio.create_task(slot.acquire()) for _ in range(3)]
    await settle()
    slot.release()  # hands the slot to waiters[0]...
    waiters[0].cancel()  # ...cancelled before it runs
    waiters[1].cancel()  # and the next one is cancelled while still queued
    await settle()
    assert waiters[0].cancelled() and waiters[1].cancelled()
    assert waiters[2].done() and slot.busy, "the slot went on to the last waiter"
    slot.release()
    assert not slot.busy and slot.try_acquire()
