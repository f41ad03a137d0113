"""PairedSender: the failover timer, backlog rotation and pings, on a fake clock."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from georep import AllRegionsUnavailableError, ErrorKind, PairedNamespaceOptions, PairedSender
from georep._lifecycle import STOP_TIMEOUT
from georep.exceptions import RegionError
from georep.testing import FakeBatch, FakeClock, FakeMessage, InMemoryRegionSender, settle


def rewrite(
    message: FakeMessage, destination: str, *, schedule_time_utc: datetime | None = None
) -> FakeMessage:
    copy = FakeMessage(message.body, message.message_id, message.subject)
    copy.application_properties = {**message.application_properties, "x-ms-path": destination}
    if schedule_time_utc is not None:
        copy.application_properties["x-ms-scheduledenqueuetimeutc"] = schedule_time_utc.isoformat()
    return copy


def ping() -> FakeMessage:
    return FakeMessage(b"", subject="ping")


def build(
    clock: FakeClock, count: int = 3, **options: Any
) -> tuple[PairedSender, InMemoryRegionSender, list[InMemoryRegionSender]]:
    primary = InMemoryRegionSender("primary", f"east-{id(clock)}", "orders")
    backlog = [
        InMemoryRegionSender(f"backlog-{i}", "west", f"east/x-servicebus-transfer/{i}")
        for i in range(count)
    ]
    sender = PairedSender(
        primary,
        backlog,
        rewrite=rewrite,
        make_ping=ping,
        options=PairedNamespaceOptions(backlog_queue_count=count, **options),
        rng=random.Random(7),
        clock=clock,
    )
    return sender, primary, backlog


async def test_sends_fail_for_the_interval_then_go_to_backlog_queues() -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, failover_interval=60, ping_primary_interval=30)
    primary.fail_with(ErrorKind.CONNECTION)

    with pytest.raises(RegionError):
        await sender.send_messages(FakeMessage(b"1", "m1"))
    await clock.advance(59)
    with pytest.raises(RegionError):
        await sender.send_messages(FakeMessage(b"2", "m2"))
    await clock.advance(1)
    where = await sender.send_messages(FakeMessage(b"3", "m3"))

    assert where.startswith("east/x-servicebus-transfer/") and sender.state.engaged
    [copy] = [m for q in backlog for m in q.accepted]
    assert copy.message_id == "m3" and copy.application_properties["x-ms-path"] == "orders"

    # A successful ping sends new messages to the primary again at once; pings stop.
    primary.restore()
    await clock.advance(30)
    assert not sender.state.engaged and sender.pings == 1
    assert await sender.send_messages(FakeMessage(b"4", "m4")) == "primary"
    await clock.advance(300)
    assert sender.pings == 1
    assert [m.subject for m in primary.accepted] == ["ping", None]
    await sender.aclose()


async def refused_without_failover(
    sender: PairedSender, primary: InMemoryRegionSender, kind: ErrorKind
) -> None:
    """A send the primary refuses with ``kind`` is raised, and the sender does not fail over."""
    primary.fail_with(kind)
    with pytest.raises(RegionError):
        await sender.send_messages(FakeMessage(b"x"))
    assert not sender.state.engaged


async def test_zero_interval_fails_over_on_the_first_failure_and_auth_never_does() -> None:
    clock = FakeClock()
    sender, primary, _ = build(clock, failover_interval=0)
    await refused_without_failover(sender, primary, ErrorKind.AUTHENTICATION)
    await refused_without_failover(sender, primary, ErrorKind.SERVER_BUSY)
    primary.fail_with(ErrorKind.CONNECTION)
    assert (await sender.send_messages(FakeMessage(b"c"))) != "primary"
    await sender.aclose()


async def test_a_failing_backlog_queue_leaves_the_rotation() -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, failover_interval=0)
    primary.fail_with(ErrorKind.CONNECTION)
    backlog[0].fail_with(ErrorKind.CONNECTION)
    backlog[1].fail_with(ErrorKind.CONNECTION)
    places = {await sender.send_messages(FakeMessage(b"%d" % i)) for i in range(10)}
    assert places == {"east/x-servicebus-transfer/2"}
    assert backlog[0].attempts <= 1 and backlog[1].attempts <= 1
    backlog[2].fail_with(ErrorKind.CONNECTION)
    with pytest.raises(AllRegionsUnavailableError):
        await sender.send_messages(FakeMessage(b"x"))
    await sender.aclose()


async def test_a_backlog_queue_rejoins_the_rotation_after_the_ping_interval() -> None:
    """One failed (slow) send must not take a backlog queue away for the whole outage."""
    clock = FakeClock()
    sender, primary, backlog = build(clock, count=2, failover_interval=0, ping_primary_interval=5)
    primary.fail_with(ErrorKind.CONNECTION)
    for queue in backlog:
        queue.fail_with(ErrorKind.TIMEOUT)
    with pytest.raises(AllRegionsUnavailableError):
        await sender.send_messages(FakeMessage(b"a"))
    assert [q.attempts for q in backlog] == [1, 1], "each backlog queue tried once per call"
    for queue in backlog:
        queue.restore()
    with pytest.raises(AllRegionsUnavailableError):
        await sender.send_messages(FakeMessage(b"b"))  # both still out of the rotation
    await clock.advance(5)
    assert await sender.send_messages(FakeMessage(b"c")) in {q.entity for q in backlog}
    await sender.aclose()


async def test_senders_on_the_pair_learn_of_failover_at_once() -> None:
    clock = FakeClock()
    first, primary, backlog = build(clock, failover_interval=0)
    second = PairedSender(
        primary,
        backlog,
        rewrite=rewrite,
        make_ping=ping,
        options=PairedNamespaceOptions(backlog_queue_count=3, failover_interval=0),
        clock=clock,
    )
    primary.fail_with(ErrorKind.CONNECTION)
    await first.send_messages(FakeMessage(b"a"))
    attempts = primary.attempts
    assert (await second.send_messages(FakeMessage(b"b"))) != "primary"
    assert primary.attempts == attempts, "the second sender did not try the primary"
    await first.aclose()
    await second.aclose()
    await asyncio.sleep(0)


async def test_lists_batches_and_schedules_work_before_and_after_failover() -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, failover_interval=0)
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert await sender.send_messages([FakeMessage(b"a", "a"), FakeMessage(b"b", "b")]) == "primary"
    numbers = await sender.schedule_messages([FakeMessage(b"s", "s")], when)
    assert numbers == list(primary.scheduled)
    await sender.cancel_scheduled_messages(numbers[0])
    assert primary.scheduled == {}

    primary.fail_with(ErrorKind.CONNECTION)
    assert await sender.send_messages([FakeMessage(b"c", "c"), FakeMessage(b"d", "d")]) != "primary"
    batch = FakeBatch(1000, lambda _: None)
    batch.add_message(FakeMessage(b"e", "e"))
    batch.add_message(FakeMessage(b"f", "f"))
    assert await sender.send_messages(batch) != "primary"
    assert await sender.schedule_messages(FakeMessage(b"g", "g"), when) == []

    copies = {m.message_id: m for q in backlog for m in q.accepted}
    assert sorted(copies) == ["c", "d", "e", "f", "g"], "each message rewritten, none lost"
    assert all(m.application_properties["x-ms-path"] == "orders" for m in copies.values())
    assert copies["g"].application_properties["x-ms-scheduledenqueuetimeutc"] == when.isoformat()
    await sender.aclose()


async def test_a_message_every_backlog_queue_would_refuse_is_raised_not_rotated() -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, failover_interval=0)
    primary.fail_with(ErrorKind.CONNECTION)
    for queue in backlog:
        queue.fail_with(ErrorKind.MESSAGE_TOO_LARGE)
    with pytest.raises(RegionError) as raised:
        await sender.send_messages(FakeMessage(b"big"))
    assert raised.value.kind is ErrorKind.MESSAGE_TOO_LARGE
    assert sum(q.attempts for q in backlog) == 1 and not sender.state.excluded
    await sender.aclose()


async def test_a_service_error_does_not_start_the_failover_timer() -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, failover_interval=0)
    await refused_without_failover(sender, primary, ErrorKind.SERVICE_ERROR)
    assert all(q.attempts == 0 for q in backlog)
    await sender.aclose()


async def test_failback_waits_until_the_primary_answered_every_ping_for_failback_after() -> None:
    clock = FakeClock()
    sender, primary, _ = build(
        clock, failover_interval=0, ping_primary_interval=10, failback_after=25
    )
    primary.fail_with(ErrorKind.CONNECTION)
    assert await sender.send_messages(FakeMessage(b"a")) != "primary"
    primary.restore()
    await clock.advance(10)  # ping 1 answers: healthy since t=10
    await clock.advance(10)  # ping 2 answers (10 s healthy)
    assert sender.state.engaged
    primary.fail_with(ErrorKind.CONNECTION)
    await clock.advance(10)  # ping 3 fails: the healthy time starts over
    primary.restore()
    await clock.advance(20)  # pings 4, 5 answer (10 s healthy)
    assert sender.state.engaged
    await clock.advance(20)  # pings 6, 7: 30 s healthy >= 25
    assert not sender.state.engaged and sender.pings == 7
    assert await sender.send_messages(FakeMessage(b"b")) == "primary"
    await sender.aclose()


async def test_session_messages_are_stamped_in_order_through_the_backlog() -> None:
    # The same stamps as a GeoSender's (docs/sessions.md): one writer numbers each session,
    # through an engaged failover (the backlog copies keep them), with the generation of
    # the failover state; a message without a MessageId gets one, as its stamp's key.
    from georep.send.ordering import read_stamp

    clock = FakeClock()
    sender, primary, backlog = build(clock, count=1, failover_interval=0)
    await sender.send_messages(FakeMessage(b"1", "m1", session_id="S"))
    primary.fail_with(ErrorKind.CONNECTION)
    await sender.send_messages(FakeMessage(b"2", None, session_id="S"))
    await sender.send_messages([FakeMessage(b"3", "m3", session_id="S")])
    await sender.send_messages(FakeMessage(b"plain", "p"))
    await sender.aclose()

    sent = [*primary.accepted, *backlog[0].accepted]
    stamps = [read_stamp(m.application_properties.get) for m in sent]
    assert sent[0].message_id == "m1" and sent[1].message_id  # the second was given an id
    assert [s.seq for s in stamps[:3] if s] == [1, 2, 3]
    assert [s.prev for s in stamps[:3] if s] == [None, "m1", sent[1].message_id]
    assert len({s.writer for s in stamps[:3] if s}) == 1
    # The generation when the send began: the second began before its failure engaged
    # failover, the third after.
    assert [s.generation for s in stamps[:3] if s] == [0, 0, 1]
    assert stamps[3] is None  # no session: not stamped


# -- the entity's pinger is shared: reference-counted, stopped by the last sender ---------


def sender_of(
    clock: FakeClock, primary: InMemoryRegionSender, backlog: list[InMemoryRegionSender]
) -> PairedSender:
    """A PairedSender that owns ``primary`` (as one made by from_connection_strings)."""
    sender = PairedSender(
        primary,
        backlog,
        rewrite=rewrite,
        make_ping=ping,
        options=PairedNamespaceOptions(
            backlog_queue_count=len(backlog), failover_interval=0, ping_primary_interval=10
        ),
        clock=clock,
    )
    sender._owned.append(primary)
    return sender


async def test_closing_one_sender_keeps_pinging_for_the_others_of_the_entity() -> None:
    """Issue 26: the first sender's close cancelled the entity's pinger, and its other
    senders stayed engaged, sending to the backlog, until the process restarted."""
    clock = FakeClock()
    namespace = f"east-{id(clock)}"
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    first_primary = InMemoryRegionSender("primary", namespace, "orders")
    second_primary = InMemoryRegionSender("primary", namespace, "orders")
    first = sender_of(clock, first_primary, backlog)
    second = sender_of(clock, second_primary, backlog)
    assert first.state is second.state
    first_primary.fail_with(ErrorKind.CONNECTION)
    second_primary.fail_with(ErrorKind.CONNECTION)
    assert await first.send_messages(FakeMessage(b"a")) != "primary"  # engaged; pinger on

    await first.aclose()  # its client is closed: it answers nothing any more
    assert first_primary.closed and second.state.engaged
    second_primary.restore()
    await clock.advance(10)
    assert not second.state.engaged, "the second sender's pings ended the failover"
    assert second.pings == 1 and first.pings == 0
    assert await second.send_messages(FakeMessage(b"b")) == "primary"
    await second.aclose()


async def test_the_last_sender_to_close_stops_the_pinger() -> None:
    clock = FakeClock()
    namespace = f"east-{id(clock)}"
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    primaries = [InMemoryRegionSender("primary", namespace, "orders") for _ in range(2)]
    senders = [sender_of(clock, primary, backlog) for primary in primaries]
    for primary in primaries:
        primary.fail_with(ErrorKind.CONNECTION)
    await senders[0].send_messages(FakeMessage(b"a"))

    def pinging() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("georep-ping")]

    assert pinging()
    await senders[1].aclose()
    assert pinging(), "the other sender of the entity is still open"
    await senders[0].aclose()
    assert not pinging() and senders[0].state.pinger is None
    attempts = [primary.attempts for primary in primaries]
    await clock.advance(100)
    assert [primary.attempts for primary in primaries] == attempts, "no ping after close"


async def test_close_gives_up_on_a_ping_that_swallows_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stopping the pinger awaited it without a bound: a ping stuck in a call that swallows
    cancellation hung aclose(), and the clients were never closed."""
    clock = FakeClock()
    sender, primary, _ = build(clock, count=1, failover_interval=0, ping_primary_interval=10)
    sender._owned.append(primary)
    let_go = asyncio.Event()

    async def stubborn_send(messages: Any, *, timeout: float) -> None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                continue

    primary.fail_with(ErrorKind.CONNECTION)
    await sender.send_messages(FakeMessage(b"a"))
    primary.send = stubborn_send  # type: ignore[method-assign]
    await clock.advance(10)  # the ping is sent, and never returns
    closing = asyncio.create_task(sender.aclose())
    await clock.advance(STOP_TIMEOUT)
    assert closing.done() and primary.closed
    assert "georep-ping orders did not end within" in caplog.text
    let_go.set()
    await settle()


async def test_a_failed_pinger_stop_does_not_skip_closing_the_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    sender, primary, backlog = build(clock, count=1)
    sender._owned.extend([primary, *backlog])

    async def broken_stop() -> None:
        raise RuntimeError("stop failed")

    sender._failover.stop = broken_stop  # type: ignore[method-assign]
    await sender.aclose()
    assert primary.closed and backlog[0].closed
    assert "leaving the entity's failover (pinger) failed: RuntimeError" in caplog.text


async def test_a_ping_round_that_raises_is_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pinger that died on an unexpected error left the entity engaged for good."""
    clock = FakeClock()
    pings = 0

    def flaky_ping() -> FakeMessage:
        nonlocal pings
        pings += 1
        if pings == 1:
            raise RuntimeError("building the ping failed")
        return ping()

    primary = InMemoryRegionSender("primary", f"east-{id(clock)}", "orders")
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    sender = PairedSender(
        primary,
        backlog,
        rewrite=rewrite,
        make_ping=flaky_ping,
        options=PairedNamespaceOptions(
            backlog_queue_count=1, failover_interval=0, ping_primary_interval=10
        ),
        clock=clock,
    )
    primary.fail_with(ErrorKind.CONNECTION)
    await sender.send_messages(FakeMessage(b"a"))
    primary.restore()
    await clock.advance(10)
    assert sender.state.engaged and "pinging orders failed" in caplog.text
    await clock.advance(10)
    assert not sender.state.engaged, "the next round pinged, and the primary answered"
    await sender.aclose()


async def test_a_sender_joining_an_engaged_entity_whose_senders_closed_pings_again() -> None:
    """The last sender's close stops the pinger, but the entity's state lives on while
    anything holds it: a new sender found it engaged, with nobody pinging, for good."""
    clock = FakeClock()
    namespace = f"east-{id(clock)}"
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    primary = InMemoryRegionSender("primary", namespace, "orders")
    first = sender_of(clock, primary, backlog)
    primary.fail_with(ErrorKind.CONNECTION)
    await first.send_messages(FakeMessage(b"a"))
    await first.aclose()  # the last sender of the entity: the pinger stops
    second = sender_of(clock, InMemoryRegionSender("primary", namespace, "orders"), backlog)
    assert second.state is first.state and second.state.engaged
    assert await second.send_messages(FakeMessage(b"b")) != "primary"
    await clock.advance(10)
    assert not second.state.engaged and second.pings == 1
    await second.aclose()
