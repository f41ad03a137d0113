"""A caller's cancellation survives a region call that swallows it.

Python 3.11's ``asyncio.wait_for`` (which the SDK's AMQP layer uses for every frame it
reads) returns the result when that result and the caller's cancellation arrive together:
the cancellation is gone, and the SDK call returns as if nothing happened. A georep call
to a region must still end by the caller's ``CancelledError`` (a full suite run caught a
cancelled drop-in send returning normally). Tested for the deadline every region call
runs in, and at random through the whole send path.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import pytest
from _senders import geo

from georep import ReplicationMode
from georep.testing import FakeClock, FakeMessage, InMemoryOutbox, InMemoryRegionSender


async def _swallow_then(result: Any) -> Any:
    """Wait to be cancelled, then swallow the cancellation and return ``result``."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return result
    raise AssertionError("not reached")


async def _in_deadline(clock: FakeClock, body: Any) -> Any:
    with clock.deadline(5.0):
        return await body


async def test_a_body_that_swallows_the_callers_cancellation_still_ends_cancelled(
    clock: FakeClock,
) -> None:
    call = asyncio.create_task(_in_deadline(clock, _swallow_then("answer")))
    await asyncio.sleep(0)
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_a_body_that_turns_the_cancellation_into_an_error_still_ends_cancelled(
    clock: FakeClock,
) -> None:
    async def converts() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionError("link detached") from None

    call = asyncio.create_task(_in_deadline(clock, converts()))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError) as raised:
        await call
    assert isinstance(raised.value.__cause__, ConnectionError)


async def test_a_body_that_swallows_only_the_deadlines_cancellation_returns(
    clock: FakeClock,
) -> None:
    call = asyncio.create_task(_in_deadline(clock, _swallow_then("late answer")))
    await asyncio.sleep(0)
    await clock.advance(5.0)
    assert await call == "late answer"


async def test_the_deadline_and_the_caller_both_swallowed_end_cancelled(
    clock: FakeClock,
) -> None:
    async def swallows_twice() -> str:
        for _ in range(2):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        return "answer"

    call = asyncio.create_task(_in_deadline(clock, swallows_twice()))
    await asyncio.sleep(0)
    await clock.advance(5.0)  # the deadline's cancellation, swallowed
    assert call.cancel()  # then the caller's, swallowed too
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_a_cancellation_swallowed_before_the_call_is_not_raised_by_it(
    clock: FakeClock,
) -> None:
    """Only a cancellation that arrives during the call is the call's to re-raise: one the
    application swallowed earlier (its own business) does not fail every later call."""

    async def application() -> str:
        # Swallowed, without uncancel(): still counted by the task.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        with clock.deadline(5.0):
            await asyncio.sleep(0)
        return "went on"

    task = asyncio.create_task(application())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == "went on"


class Swallowing(InMemoryRegionSender):
    """A region whose send takes a few turns of the loop and, half the time, swallows a
    cancellation that arrives meanwhile and completes (as ``wait_for`` does)."""

    def __init__(self, *args: Any, rng: random.Random, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rng = rng

    async def send(self, messages: Any, *, timeout: float) -> None:
        try:
            for _ in range(self.rng.randrange(0, 6)):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if self.rng.random() < 0.5:
                raise
        await super().send(messages, timeout=timeout)


@pytest.mark.parametrize("outbox", [False, True], ids=["no-outbox", "outbox"])
@pytest.mark.parametrize("mode", [ReplicationMode.PASSIVE, ReplicationMode.ACTIVE])
async def test_a_send_cancelled_at_random_ends_cancelled_whatever_the_sdk_swallows(
    clock: FakeClock, mode: ReplicationMode, outbox: bool
) -> None:
    rng = random.Random(f"{mode.value}-{outbox}")
    primary = Swallowing("primary", "east.example", "orders", clock=clock, rng=rng)
    secondary = Swallowing("secondary", "west.example", "orders", clock=clock, rng=rng)
    options: dict[str, Any] = {"outbox": InMemoryOutbox()} if outbox else {}
    sender = geo(primary, secondary, mode=mode, clock=clock, **options)
    outcomes = {"cancelled": 0, "completed": 0}
    try:
        for trial in range(300):
            sending = asyncio.create_task(sender.send_messages(FakeMessage(b"%d" % trial)))
            for _ in range(rng.randrange(0, 8)):
                await asyncio.sleep(0)
            if sending.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await sending
                outcomes["cancelled"] += 1
            else:
                await sending
                outcomes["completed"] += 1
    finally:
        await sender.aclose()
    # Both branches ran many times: the trial is a test of the race, not of one side of it.
    assert min(outcomes.values()) > 30, outcomes
