"""The lifecycle base every public async object shares, on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from georep._lifecycle import AsyncResource, close_all
from georep.exceptions import ClosedError
from georep.testing import FakeClock


class Thing(AsyncResource):
    def __init__(self) -> None:
        self.opened = 0
        self.closes = 0
        self.release = asyncio.Event()
        self.release.set()

    async def _open(self) -> None:
        self.opened += 1

    async def _close(self) -> None:
        self.closes += 1
        await self.release.wait()

    async def use(self) -> str:
        self._check_open()
        return "used"


async def test_async_with_opens_and_closes_once() -> None:
    async with Thing() as thing:
        assert thing.opened == 1 and not thing.closed
        assert await thing.use() == "used"
    assert thing.closed and thing.closes == 1
    await thing.aclose()
    await thing.close()
    assert thing.closes == 1, "close is idempotent"


async def test_a_closed_object_refuses_use_and_reentry_naming_itself() -> None:
    thing = Thing()
    await thing.aclose()
    with pytest.raises(ClosedError, match="this Thing is closed; create a new Thing"):
        await thing.use()
    with pytest.raises(ClosedError):
        async with thing:
            pass


async def test_cancelling_the_caller_does_not_cancel_the_close() -> None:
    thing = Thing()
    thing.release.clear()
    closing = asyncio.ensure_future(thing.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert thing._close_task is not None and not thing._close_task.done()
    thing.release.set()
    await thing.aclose()  # a second caller waits for the same close
    assert thing._close_task.done() and thing.closes == 1


class Client:
    def __init__(self, *, fails: bool = False, hangs: bool = False) -> None:
        self.fails, self.hangs, self.closed = fails, hangs, False

    async def close(self) -> None:
        if self.hangs:
            await asyncio.Event().wait()
        if self.fails:
            raise OSError("secret-endpoint.example refused")
        self.closed = True


async def test_close_all_closes_the_rest_when_one_fails_and_logs_the_type_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clients = [Client(), Client(fails=True), Client()]
    await close_all(clients, timeout=5, clock=FakeClock(), what="sender")
    assert [c.closed for c in clients] == [True, False, True]
    assert "OSError" in caplog.text and "secret-endpoint" not in caplog.text


async def test_close_all_gives_up_on_a_stuck_close_at_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    clients = [Client(hangs=True), Client()]
    closing = asyncio.ensure_future(close_all(clients, timeout=3, clock=clock, what="receiver"))
    await asyncio.sleep(0)
    assert not closing.done()
    await clock.advance(3)
    await asyncio.wait_for(closing, 1)
    assert clients[1].closed
    assert "1 receiver(s) did not close within 3 s" in caplog.text
