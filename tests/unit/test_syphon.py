"""The syphon on a fake clock: long-poll cost, moving with aliases, retries, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from georep import ErrorKind, PairedNamespaceOptions, Syphon
from georep.exceptions import InvalidMessageError, MessageExpiredError, region_error
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryRegionReceiver,
    InMemoryRegionSender,
    settle,
)


def restore(message: Any) -> tuple[str, FakeMessage]:
    path = message.application_properties.get("x-ms-path")
    if path is None:
        raise InvalidMessageError("no x-ms-path")
    props = {k: v for k, v in message.application_properties.items() if k != "x-ms-path"}
    return path, FakeMessage(message.body, message.message_id, None, props)


@contextlib.asynccontextmanager
async def running(syphon: Syphon, clock: FakeClock) -> AsyncIterator[None]:
    """Run ``syphon`` for the block, then close it and let its long polls end."""
    task = asyncio.create_task(syphon.run())
    yield
    await syphon.aclose()
    await clock.advance(900)
    await task


def build(
    clock: FakeClock, count: int = 10, restore: Callable[[Any], tuple[str, FakeMessage]] = restore
) -> tuple[Syphon, list[InMemoryRegionReceiver], InMemoryRegionSender]:
    queues = [
        InMemoryRegionReceiver(f"b{i}", "west", f"east/x-servicebus-transfer/{i}", clock=clock)
        for i in range(count)
    ]
    primary = InMemoryRegionSender("primary", "east", "orders")
    syphon = Syphon(
        queues,
        lambda entity: primary,
        restore=restore,
        options=PairedNamespaceOptions(backlog_queue_count=count),
        clock=clock,
    )
    return syphon, queues, primary


@contextlib.asynccontextmanager
async def moving_one(
    clock: FakeClock, failure: ErrorKind, *, path: str = "orders", times: int | None = None
) -> AsyncIterator[tuple[Syphon, InMemoryRegionReceiver, InMemoryRegionSender]]:
    """A syphon running over one backlog queue that holds message ``m1`` for ``path``, to a
    primary failing with ``failure`` (``times`` times, or until restored)."""
    syphon, [queue], primary = build(clock, count=1)
    primary.fail_with(failure, times=times)
    queue.put(FakeMessage(b"a", "m1", None, {"x-ms-path": path}))
    async with running(syphon, clock):
        yield syphon, queue, primary


async def test_ten_idle_backlog_queues_cost_40_receive_calls_an_hour() -> None:
    clock = FakeClock()
    syphon, _, _ = build(clock)
    async with running(syphon, clock):
        await clock.advance(3600 - 1)  # 15-minute long polls: 4 per queue per hour
        assert syphon.stats.receive_calls == 40


async def test_messages_move_to_their_entity_and_leave_the_backlog() -> None:
    clock = FakeClock()
    syphon, queues, primary = build(clock, count=2)
    queues[0].put(FakeMessage(b"a", "m1", None, {"x-ms-path": "orders", "app": "v"}))
    queues[1].put(FakeMessage(b"b", "m2", None, {"x-ms-path": "orders"}))
    queues[1].put(FakeMessage(b"lost", "m3"))  # no x-ms-path: dead-lettered
    async with running(syphon, clock):
        await clock.advance(1)
        assert sorted(m.message_id for m in primary.accepted) == ["m1", "m2"]
        assert primary.accepted[0].application_properties == {"app": "v"}
        assert [m.message_id for m in queues[1].dead_lettered] == ["m3"]
        assert queues[0].pending == queues[1].pending == 0
        assert syphon.stats.moved == 2 and syphon.stats.billed_operations == 8


async def test_while_the_primary_is_down_messages_wait_in_the_backlog() -> None:
    clock = FakeClock()
    async with moving_one(clock, ErrorKind.CONNECTION) as (syphon, queue, primary):
        await clock.advance(10)
        assert primary.accepted == [] and queue.pending == 1 and syphon.stats.retries >= 5
        primary.restore()
        await clock.advance(2)
        assert [m.message_id for m in primary.accepted] == ["m1"] and queue.pending == 0


async def test_a_message_the_primary_refuses_for_good_is_dead_lettered() -> None:
    clock = FakeClock()
    async with moving_one(clock, ErrorKind.ENTITY_NOT_FOUND, path="gone") as (_, queue, _):
        await clock.advance(1)
        assert [m.message_id for m in queue.dead_lettered] == ["m1"]


async def test_a_faulted_secondary_client_closes_the_primary_side_after_5_s() -> None:
    clock = FakeClock()
    syphon, queues, primary = build(clock, count=2)
    queues[0].put(FakeMessage(b"a", "m1", None, {"x-ms-path": "orders"}))
    task = asyncio.create_task(syphon.run())
    await clock.advance(1)
    assert [m.message_id for m in primary.accepted] == ["m1"]

    async def refused(*_: Any, **__: Any) -> list[Any]:
        from georep.exceptions import AuthenticationError

        raise AuthenticationError("key revoked", region="secondary", kind=ErrorKind.AUTHENTICATION)

    for queue in queues:
        queue.receive = refused  # type: ignore[method-assign]
    await clock.advance(900)  # the current long polls end; the next receive faults
    assert "secondary" in syphon.faulted and not primary.closed
    await clock.advance(5)
    await asyncio.wait_for(task, 1)
    assert primary.closed and syphon.closed_partner == "primary"


async def test_a_faulted_primary_client_hands_messages_back_and_closes_the_backlog_side() -> None:
    clock = FakeClock()
    syphon, queues, primary = build(clock, count=1)
    primary.fail_with(ErrorKind.AUTHENTICATION)
    queues[0].put(FakeMessage(b"a", "m1", None, {"x-ms-path": "orders"}))
    task = asyncio.create_task(syphon.run())
    await clock.advance(1)
    assert queues[0].dead_lettered == [] and len(queues[0].abandoned) == 1
    await clock.advance(5)
    await clock.advance(900)
    await asyncio.wait_for(task, 1)
    assert queues[0].closed and syphon.closed_partner == "secondary"


async def test_an_expired_message_is_dead_lettered_and_counted_never_moved() -> None:
    clock = FakeClock()

    def restore_or_expire(message: Any) -> tuple[str, FakeMessage]:
        if message.application_properties.get("expired"):
            raise MessageExpiredError("outlived its time to live")
        return restore(message)

    syphon, queues, primary = build(clock, count=1, restore=restore_or_expire)
    queues[0].put(FakeMessage(b"a", "old", None, {"x-ms-path": "orders", "expired": True}))
    queues[0].put(FakeMessage(b"b", "fresh", None, {"x-ms-path": "orders"}))
    async with running(syphon, clock):
        await clock.advance(1)
        assert [m.message_id for m in primary.accepted] == ["fresh"]
        assert [m.message_id for m in queues[0].dead_lettered] == ["old"]
        assert syphon.stats.expired == 1 and syphon.stats.moved == 1


async def test_a_service_error_from_the_primary_is_retried_not_dead_lettered() -> None:
    clock = FakeClock()
    async with moving_one(clock, ErrorKind.SERVICE_ERROR, times=2) as (_, queue, primary):
        await clock.advance(5)
        assert [m.message_id for m in primary.accepted] == ["m1"] and queue.dead_lettered == []


def other_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still running besides the test's own."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_a_failed_drain_stops_the_others_and_is_raised() -> None:
    """run() gathered the drains: one that raised left the others long-polling, unowned."""

    def broken(message: Any) -> tuple[str, FakeMessage]:
        raise RuntimeError("a bug in restore")

    clock = FakeClock()
    syphon, queues, _ = build(clock, count=3, restore=broken)
    queues[0].put(FakeMessage(b"a", "m1", None, {"x-ms-path": "orders"}))
    task = asyncio.create_task(syphon.run())
    await clock.advance(1)
    assert task.done()
    with contextlib.suppress(RuntimeError):
        task.result()
    assert isinstance(task.exception(), RuntimeError)
    assert other_tasks() == []
    await syphon.aclose()


async def test_aclose_stops_the_partner_closer_timer() -> None:
    """aclose() left the partner closer's timer running: run() then waited for it
    (partner_close_timeout) after the syphon was closed."""
    clock = FakeClock()
    syphon, [queue], primary = build(clock, count=1)
    primary.fail_with(ErrorKind.AUTHENTICATION)  # the primary client faults
    queue.put(FakeMessage(b"a", "m1", None, {"x-ms-path": "orders"}))
    task = asyncio.create_task(syphon.run())
    await clock.advance(1)
    assert "primary" in syphon.faulted
    await syphon.aclose()
    await settle()  # no time passes: the timer (5 s) is stopped, not waited for
    assert task.done() and task.exception() is None
    assert other_tasks() == []


class _InFlight:
    """A syphon whose move in flight completes once it is asked to close."""

    def __init__(self) -> None:
        self.stats = SimpleNamespace(
            moved=0, dead_lettered=0, retries=0, receive_calls=1, billed_operations=0
        )
        self.closing = asyncio.Event()

    async def run(self) -> None:
        await self.closing.wait()
        self.stats.moved = 1  # the move in flight completes its backlog copy

    async def aclose(self) -> None:
        self.closing.set()


def _syphon_command_until_sigterm() -> None:
    """`georep syphon`'s loop over an :class:`_InFlight`, until this process gets SIGTERM."""
    from georep.cli._app import _run_syphon

    async def scenario() -> None:
        running = asyncio.create_task(_run_syphon(_InFlight(), report_every=3600, long_poll=1))
        await asyncio.sleep(0)  # its signal handlers are in place
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(running, 40)

    asyncio.run(scenario())


def test_the_syphon_command_reports_a_move_that_finished_after_the_signal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`georep syphon` printed its figures before it closed the syphon: a move in flight at
    SIGTERM finished afterwards, and the last figures said 'moved 0'."""
    _syphon_command_until_sigterm()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "moved 1  dead-lettered 0  retries 0  receive calls 1  billed operations 1",
        "syphon stopped",
    ]


def test_the_syphon_command_leaves_an_ignored_sigint_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`georep syphon` under nohup (SIGINT ignored), stopped by SIGTERM: the first
    fresh-clone run of this session, started in the background, found SIGINT set to
    ``default_int_handler`` after it (the loop's removal of its handler sets that)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _syphon_command_until_sigterm()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().out.splitlines()[-1] == "syphon stopped"


async def test_a_missing_backlog_queue_is_said_once_in_ten_rounds_with_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each failed round logged a warning, one a second per queue for as long as the queue
    was missing; now the first and every tenth, naming the fix, backing off to 5 s."""
    clock = FakeClock()
    syphon, queues, _ = build(clock, count=1)
    calls = 0

    async def missing(*_: Any, **__: Any) -> list[Any]:
        nonlocal calls
        calls += 1
        raise region_error("b0: not found", region="b0", kind=ErrorKind.ENTITY_NOT_FOUND)

    queues[0].receive = missing  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="georep.syphon"):
        async with running(syphon, clock):
            await clock.advance(60)
    said = [r.getMessage() for r in caplog.records if "backlog queue" in r.getMessage()]
    assert 1 <= len(said) <= 2 and "ensure_backlog_queues" in said[0], said
    assert calls >= 12, "it kept trying, every 5 s at most"
