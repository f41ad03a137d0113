"""The lifecycle base every public async object shares, on virtual time."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from georep._lifecycle import (
    STOP_TIMEOUT,
    AsyncResource,
    close_all,
    close_in_order,
    finish_task,
    start_task,
    stop_task,
)
from georep.exceptions import ClosedError
from georep.testing import FakeClock, settle


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


# -- background tasks: start_task, stop_task, close_in_order ----------------------------


async def ends_slowly_when_cancelled(release: asyncio.Event) -> None:
    """Runs until cancelled, then needs ``release`` before it ends (a graceful unwind)."""
    try:
        await asyncio.Event().wait()
    finally:
        await release.wait()


async def swallows_cancellation(let_go: asyncio.Event) -> None:
    """A task that ends only once ``let_go`` is set, whatever its owner does (a handler
    that catches everything); the test sets it at the end, so the loop can close."""
    while not let_go.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await let_go.wait()


async def test_stop_task_never_swallows_the_callers_own_cancellation() -> None:
    """The shape ``task.cancel(); with suppress(CancelledError): await task`` swallowed a
    cancellation of the caller that arrived during the wait (issue 26)."""
    clock = FakeClock()
    release = asyncio.Event()
    owned = asyncio.create_task(ends_slowly_when_cancelled(release))
    await settle()
    caller = asyncio.create_task(stop_task(owned, clock=clock))
    await settle()
    assert owned.cancelling() and not caller.done()
    caller.cancel()  # the caller itself is being cancelled while it waits
    await settle()
    assert caller.cancelled(), "the caller's cancellation must propagate"
    release.set()
    await settle()
    assert owned.cancelled()


async def test_stop_task_reraises_a_caller_cancellation_swallowed_before_it() -> None:
    clock = FakeClock()
    owned = asyncio.create_task(asyncio.Event().wait())
    swallowed = asyncio.Event()

    async def caller() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # someone on the way swallowed it (cancelling() stays 1)
        await stop_task(owned, clock=clock)

    task = asyncio.create_task(caller())
    await settle()
    task.cancel()
    await settle()
    assert swallowed.is_set() and task.cancelled() and owned.cancelled()


async def test_stop_task_gives_up_on_a_task_that_swallows_cancellation_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    let_go = asyncio.Event()
    stuck = asyncio.create_task(swallows_cancellation(let_go), name="georep-stuck")
    await settle()
    stopping = asyncio.create_task(stop_task(stuck, timeout=3, clock=clock))
    await clock.advance(2.9)
    assert not stopping.done()
    await clock.advance(0.1)
    assert stopping.done() and stopping.result() is False
    assert "georep-stuck did not end within 3 s of being cancelled" in caplog.text
    let_go.set()
    await stuck


async def test_stop_task_returns_true_for_a_task_that_ends() -> None:
    owned = asyncio.create_task(asyncio.Event().wait())
    await settle()
    assert await stop_task(owned, clock=FakeClock()) and owned.cancelled()
    assert await stop_task(owned) and await stop_task(None)


async def test_start_task_logs_a_crash_when_it_happens(caplog: pytest.LogCaptureFixture) -> None:
    async def crash() -> None:
        raise RuntimeError("the store raised")

    task = start_task(crash(), name="georep-probe orders")
    await settle()
    assert task.done()
    assert "background task georep-probe orders ended with RuntimeError" in caplog.text


async def test_close_in_order_runs_every_step_when_one_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []

    async def step(name: str, fails: bool = False) -> None:
        ran.append(name)
        if fails:
            raise OSError("secret-endpoint.example refused")

    await close_in_order(
        [
            ("stopping the pinger", lambda: step("pinger", fails=True)),
            ("closing the clients", lambda: step("clients")),
            ("flushing the ledger", lambda: step("ledger")),
        ]
    )
    assert ran == ["pinger", "clients", "ledger"]
    assert "stopping the pinger failed: OSError" in caplog.text
    assert "secret-endpoint" not in caplog.text


async def test_close_all_returns_when_a_stuck_close_swallows_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It cancelled the stuck close and then awaited it without a bound."""

    let_go = asyncio.Event()

    class Stubborn:
        async def close(self) -> None:
            await swallows_cancellation(let_go)

    clock = FakeClock()
    closing = asyncio.ensure_future(close_all([Stubborn()], timeout=3, clock=clock))
    await clock.advance(3)
    assert not closing.done()
    await clock.advance(STOP_TIMEOUT)
    assert closing.done()
    assert "did not end within" in caplog.text
    let_go.set()
    await settle()


async def test_finish_task_waits_for_a_task_that_ends_by_itself_and_keeps_its_error_quiet() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    async def ends_with_an_error() -> None:
        await release.wait()
        raise RuntimeError("its own business")

    owned = asyncio.create_task(ends_with_an_error())
    finishing = asyncio.create_task(finish_task(owned, timeout=10, clock=clock))
    await settle()
    release.set()
    assert await finishing is True
    assert isinstance(owned.exception(), RuntimeError)


async def test_finish_task_stops_a_task_still_running_at_its_timeout() -> None:
    clock = FakeClock()
    owned = asyncio.create_task(asyncio.Event().wait())
    finishing = asyncio.create_task(finish_task(owned, timeout=10, clock=clock))
    await settle()
    await clock.advance(10)
    assert await finishing is False
    assert owned.cancelled()


async def test_finish_task_never_swallows_the_callers_own_cancellation() -> None:
    """What it replaces, ``suppress(CancelledError)`` around ``wait_for(task, n)``, ate a
    Ctrl-C that arrived while the demo closed."""
    clock = FakeClock()
    owned = asyncio.create_task(asyncio.Event().wait())
    caller = asyncio.create_task(finish_task(owned, timeout=10, clock=clock))
    await settle()
    caller.cancel()
    await settle()
    assert caller.cancelled(), "the caller's cancellation must propagate"
    assert owned.cancelled(), "and the task it owned was stopped"
