"""GeoSender's replication logic against in-memory regions (no network, no real sleeps)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from _senders import down, geo, queueing, regions, up
from azure.servicebus import exceptions as azure_exceptions

from georep import (
    DEFAULT_FAILOVER_KINDS,
    AllRegionsUnavailableError,
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    DedupKey,
    DrainPolicy,
    EntityNotFoundError,
    ErrorKind,
    FailoverPolicy,
    GeoSender,
    InvalidMessageError,
    MessageNotFoundError,
    MessageTooLargeError,
    OutboxFullError,
    OversizeMessageError,
    RegionError,
    RegionUnavailableError,
    ReplicationMode,
    RoleState,
)
from georep._lifecycle import InFlight
from georep.exceptions import region_error
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryLedger,
    InMemoryOutbox,
    InMemoryRegionSender,
    settle,
)

# ----------------------------------------------------------------------------- passive


async def test_passive_sends_only_to_the_active_region_and_assigns_a_message_id() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary)
    message = FakeMessage(b"hello")

    result = await sender.send_messages(message)

    assert result.accepted == ("primary",)
    assert not result.failed_over and not result.queued
    assert message.message_id and result.message_ids == (message.message_id,)
    assert primary.accepted == [message] and secondary.accepted == []


async def test_passive_keeps_a_caller_message_id() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary)
    await sender.send_messages(FakeMessage(b"x", message_id="order-17"))
    assert primary.accepted[0].message_id == "order-17"


@pytest.mark.parametrize("kind", [ErrorKind.CONNECTION, ErrorKind.TIMEOUT, ErrorKind.SERVER_BUSY])
async def test_passive_fails_over_with_a_copy_and_swaps_roles(kind: ErrorKind) -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary)
    primary.fail_with(kind)
    message = FakeMessage(b"m1")

    result = await sender.send_messages(message)

    assert result.accepted == ("secondary",) and result.failed_over
    assert result.failed["primary"].kind is kind  # type: ignore[attr-defined]
    [copy] = secondary.accepted
    assert copy is not message, "the backup must get a copy, never the same object"
    assert copy.message_id == message.message_id and copy.body == message.body
    assert sender.active_region == "secondary"
    assert sender.stats.role_swaps == 1 and sender.stats.failovers == 1

    # The next send goes straight to the new active region.
    await sender.send_messages(FakeMessage(b"m2"))
    assert primary.attempts == 1 and [m.body for m in secondary.accepted] == [b"m1", b"m2"]


async def test_a_burst_of_concurrent_failures_swaps_exactly_once() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary)
    primary.fail_with(ErrorKind.CONNECTION)

    results = await asyncio.gather(*(sender.send_messages(FakeMessage(b"x")) for _ in range(50)))

    assert all(r.accepted == ("secondary",) for r in results)
    assert sender.roles.swaps == 1 and sender.stats.role_swaps == 1
    assert len(secondary.accepted) == 50


async def test_a_late_failure_from_before_the_swap_never_swaps_back() -> None:
    state = RoleState("east")
    before = await state.read()
    assert await state.swap(expected=before, new_active="west")
    # A send that read the roles before the swap fails on the new active: stale snapshot.
    assert not await state.swap(expected=before, new_active="east")
    assert (await state.read()).active == "west" and state.swaps == 1


async def test_senders_on_the_same_pair_share_roles() -> None:
    primary, secondary = regions("orders")
    other_primary = InMemoryRegionSender("primary", "east.example", "invoices")
    other_secondary = InMemoryRegionSender("secondary", "west.example", "invoices")
    orders = GeoSender(primary, secondary)
    invoices = GeoSender(other_primary, other_secondary)
    primary.fail_with(ErrorKind.CONNECTION)

    await orders.send_messages(FakeMessage(b"o"))
    await invoices.send_messages(FakeMessage(b"i"))

    assert orders.roles is invoices.roles
    assert invoices.active_region == "secondary"
    assert other_primary.attempts == 0 and len(other_secondary.accepted) == 1


@pytest.mark.parametrize(
    ("kind", "error_type"),
    [
        (ErrorKind.MESSAGE_TOO_LARGE, MessageTooLargeError),
        (ErrorKind.AUTHENTICATION, AuthenticationError),
        (ErrorKind.ENTITY_NOT_FOUND, EntityNotFoundError),
        (ErrorKind.ENTITY_DISABLED, EntityNotFoundError),
        # Not outages (issue 14 item 6): raised at once, region unchanged, never queued.
        (ErrorKind.SERVICE_ERROR, RegionError),
        (ErrorKind.QUOTA_EXCEEDED, RegionError),
        (ErrorKind.INVALID_ARGUMENT, RegionError),
    ],
)
async def test_errors_that_do_not_mean_unavailability_never_fail_over(
    kind: ErrorKind, error_type: type[Exception]
) -> None:
    sender, outbox, primary, secondary = queueing()
    primary.fail_with(kind)

    with pytest.raises(error_type) as raised:
        await sender.send_messages(FakeMessage(b"x"))

    assert raised.value.kind is kind  # type: ignore[attr-defined]
    assert secondary.attempts == 0 and sender.active_region == "primary"
    assert await outbox.depth() == 0
    await sender.aclose()


async def test_a_service_error_fails_over_when_the_policy_says_so() -> None:
    primary, secondary = regions()
    policy = FailoverPolicy(fail_over_on=DEFAULT_FAILOVER_KINDS | {ErrorKind.SERVICE_ERROR})
    sender = geo(primary, secondary, policy=policy)
    primary.fail_with(ErrorKind.SERVICE_ERROR)
    assert (await sender.send_messages(FakeMessage(b"x"))).failed_over


async def test_both_regions_down_raises_with_both_causes_and_keeps_roles() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary)
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.TIMEOUT)

    with pytest.raises(AllRegionsUnavailableError) as raised:
        await sender.send_messages(FakeMessage(b"x"))

    causes = raised.value.causes
    assert list(causes) == ["primary", "secondary"]
    assert causes["primary"].kind is ErrorKind.CONNECTION  # type: ignore[attr-defined]
    assert causes["secondary"].kind is ErrorKind.TIMEOUT  # type: ignore[attr-defined]
    assert "primary" in str(raised.value) and "secondary" in str(raised.value)
    assert sender.active_region == "primary" and sender.roles.swaps == 0


async def test_a_hanging_region_fails_over_at_georeps_own_deadline(clock: FakeClock) -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, clock=clock, policy=FailoverPolicy(attempt_timeout=2.0))
    primary.hang()

    send = asyncio.create_task(sender.send_messages(FakeMessage(b"x")))
    await clock.advance(1.9)
    assert not send.done() and secondary.attempts == 0
    await clock.advance(0.1)
    result = await asyncio.wait_for(send, 1)

    assert result.failed_over and result.accepted == ("secondary",)
    assert result.failed["primary"].kind is ErrorKind.TIMEOUT  # type: ignore[attr-defined]
    assert clock.monotonic() == pytest.approx(2.0)


async def test_a_burst_queued_behind_a_dead_region_fails_over_together(clock: FakeClock) -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, clock=clock, policy=FailoverPolicy(attempt_timeout=2))
    primary.hang()

    sends = [asyncio.create_task(sender.send_messages(FakeMessage(b"%d" % i))) for i in range(20)]
    await clock.advance(2)  # one deadline, not twenty
    results = await asyncio.wait_for(asyncio.gather(*sends), 1)

    assert all(r.failed_over for r in results) and len(secondary.accepted) == 20
    assert primary.attempts == 1 and sender.roles.swaps == 1


async def test_waiting_for_a_busy_region_is_not_an_outage(clock: FakeClock) -> None:
    primary = InMemoryRegionSender("primary", "east.example", clock=clock)
    secondary = InMemoryRegionSender("secondary", "west.example", clock=clock)
    primary.latency = 0.5  # each call takes 0.5 s; the queue of 10 takes 5 s
    sender = geo(primary, secondary, clock=clock, policy=FailoverPolicy(attempt_timeout=2))

    sends = [asyncio.create_task(sender.send_messages(FakeMessage(b"%d" % i))) for i in range(10)]
    for _ in range(10):
        await clock.advance(0.5)
    results = await asyncio.wait_for(asyncio.gather(*sends), 1)

    assert all(r.accepted == ("primary",) for r in results)
    assert secondary.attempts == 0 and sender.roles.swaps == 0


async def switched_over(
    clock: FakeClock, probe_interval: float, failback_after: float
) -> tuple[GeoSender, InMemoryRegionSender]:
    """A sender that switches back (probing the old active every ``probe_interval`` s, after
    ``failback_after`` s healthy), failed over: the primary is down, the secondary active."""
    primary, secondary = regions()
    policy = FailoverPolicy(
        switch_back=True, switch_back_probe_interval=probe_interval, failback_after=failback_after
    )
    sender = geo(primary, secondary, clock=clock, policy=policy)
    primary.fail_with(ErrorKind.CONNECTION)
    await sender.send_messages(FakeMessage(b"x"))
    assert sender.active_region == "secondary"
    return sender, primary


async def test_switch_back_once_the_old_active_answered_for_failback_after(
    clock: FakeClock,
) -> None:
    sender, primary = await switched_over(clock, probe_interval=30, failback_after=60)

    await clock.advance(30)  # probe fails: primary still down
    assert sender.active_region == "secondary"
    primary.restore()
    await clock.advance(30)  # first good probe: healthy for 0 s
    await clock.advance(30)  # healthy for 30 s
    assert sender.active_region == "secondary"
    await clock.advance(30)  # healthy for 60 s
    assert sender.active_region == "primary" and sender.stats.role_swaps == 2
    await sender.aclose()


async def test_a_failed_probe_restarts_the_healthy_time(clock: FakeClock) -> None:
    sender, primary = await switched_over(clock, probe_interval=10, failback_after=20)
    primary.restore()
    await clock.advance(20)  # good probes at 10 and 20 s
    primary.fail_with(ErrorKind.CONNECTION)
    await clock.advance(10)  # a bad one at 30 s
    primary.restore()
    await clock.advance(20)  # good at 40 and 50: healthy for 10 s
    assert sender.active_region == "secondary"
    await clock.advance(10)  # good at 60: healthy for 20 s
    assert sender.active_region == "primary"
    await sender.aclose()


async def test_a_probe_round_that_raises_is_logged_and_the_probe_goes_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: the switch-back probe died silently when reading the roles raised (a role
    store's error), and the roles stayed swapped for good."""
    sender, primary = await switched_over(clock, probe_interval=10, failback_after=10)
    roles = sender.roles
    read = roles.read

    async def broken_read() -> Any:
        roles.read = read  # type: ignore[method-assign]  # once
        raise RuntimeError("the role store raised")

    roles.read = broken_read  # type: ignore[method-assign]
    primary.restore()
    await clock.advance(10)
    assert "switch-back probe of primary failed" in caplog.text
    await clock.advance(20)  # good probes at 20 and 30 s: healthy for 10 s
    assert sender.active_region == "primary"
    await sender.aclose()


async def test_close_runs_every_step_when_stopping_the_probe_fails(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = regions()
    ledger = InMemoryLedger()
    sender = geo(primary, secondary, clock=clock, ledger=ledger)
    sender._owned.extend([primary, secondary])

    async def broken_stop() -> None:
        raise RuntimeError("stop failed")

    sender._parts.passive.stop = broken_stop  # type: ignore[method-assign]
    await sender.aclose()
    assert primary.closed and secondary.closed and ledger.flushes == 1
    assert "stopping the switch-back probe failed: RuntimeError" in caplog.text


# ------------------------------------------------------------------------------ active


async def test_active_sends_a_copy_with_the_same_id_to_each_region() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode=ReplicationMode.ACTIVE)
    message = FakeMessage(b"twin")

    result = await sender.send_messages(message)

    assert set(result.accepted) == {"primary", "secondary"}
    [first], [second] = primary.accepted, secondary.accepted
    assert first.message_id == second.message_id == message.message_id
    assert first is not second


async def test_a_cancelled_active_send_stops_the_secondarys_attempt_before_it_returns(
    clock: FakeClock,
) -> None:
    """The secondary's attempt is a task of the send: cancelled with it, and ended (not
    left unwinding, unowned) by the time the send's cancellation reaches its caller."""
    primary, secondary = regions()
    unwound: list[str] = []

    async def slow_to_unwind(messages: Any, *, timeout: float) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await clock.sleep(0)  # a few turns of the loop before it ends
            await clock.sleep(0)
            unwound.append("secondary")

    primary.hang()
    secondary.send = slow_to_unwind  # type: ignore[method-assign]
    sender = geo(primary, secondary, mode=ReplicationMode.ACTIVE, clock=clock)
    sending = asyncio.create_task(sender.send_messages(FakeMessage(b"x")))
    await settle()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert unwound == ["secondary"], "the secondary's attempt was still running"
    await sender.aclose()


async def test_active_with_one_region_down_succeeds_and_records_the_failure() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    secondary.fail_with(ErrorKind.CONNECTION)

    result = await sender.send_messages(FakeMessage(b"x"))

    assert result.accepted == ("primary",) and "secondary" in result.failed
    assert sender.stats.failed == {"secondary": 1}
    assert not result.repair_queued


async def test_active_skips_a_failed_region_until_its_cooldown_ends(clock: FakeClock) -> None:
    primary, secondary = regions()
    outbox = InMemoryOutbox()
    policy = FailoverPolicy(attempt_timeout=2, region_cooldown=5)
    sender = geo(
        primary, secondary, mode="active", policy=policy, clock=clock, outbox=outbox, repair=True
    )
    secondary.hang()  # a blackholed region: the first send waits for the deadline

    first = asyncio.create_task(sender.send_messages(FakeMessage(b"1")))
    await clock.advance(2)
    assert (await first).accepted == ("primary",)
    for body in (b"2", b"3"):
        result = await sender.send_messages(FakeMessage(body))  # no wait: region skipped
        assert result.accepted == ("primary",) and result.repair_queued == ("secondary",)
    assert clock.monotonic() == pytest.approx(2), "live sends did not wait for the region"

    secondary.restore()
    await clock.advance(5)
    assert set((await sender.send_messages(FakeMessage(b"4"))).accepted) == {
        "primary",
        "secondary",
    }
    await clock.advance(5)  # the drainer repairs the skipped copies
    assert sorted(m.body for m in secondary.accepted) == [b"1", b"2", b"3", b"4"]
    await sender.aclose()


async def test_active_with_both_regions_down_raises_with_each_cause() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.TIMEOUT)  # a service error is not "down"
    with pytest.raises(AllRegionsUnavailableError) as raised:
        await sender.send_messages(FakeMessage(b"x"))
    assert set(raised.value.causes) == {"primary", "secondary"}


async def test_active_raises_a_message_error_both_regions_agree_on() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active", outbox=InMemoryOutbox())
    primary.fail_with(ErrorKind.MESSAGE_TOO_LARGE)
    secondary.fail_with(ErrorKind.MESSAGE_TOO_LARGE)
    with pytest.raises(MessageTooLargeError):
        await sender.send_messages(FakeMessage(b"x"))
    assert await sender.outbox.depth() == 0  # type: ignore[union-attr]
    await sender.aclose()


async def test_active_repair_queues_the_missed_copy_for_its_region(clock: FakeClock) -> None:
    sender, outbox, primary, secondary = queueing(mode="active", repair=True, clock=clock)
    secondary.fail_with(ErrorKind.CONNECTION)

    result = await sender.send_messages(FakeMessage(b"x", message_id="m-1"))
    assert result.repair_queued == ("secondary",) and await outbox.depth() == 1

    secondary.restore()
    await clock.advance(10)  # past the region's cool-down and the drainer's backoff
    assert [m.message_id for m in secondary.accepted] == ["m-1"]
    assert [m.message_id for m in primary.accepted] == ["m-1"], "repair must not resend"
    assert await outbox.depth() == 0
    await sender.aclose()


# ------------------------------------------------------------------------------ outbox


async def test_outbox_queues_when_no_region_accepts_and_drains_after_restore(
    clock: FakeClock,
) -> None:
    drain = DrainPolicy(initial_backoff=1, max_backoff=8, idle_interval=1)
    sender, outbox, primary, secondary = queueing(clock=clock, drain=drain)
    down(primary, secondary)

    results = [await sender.send_messages(FakeMessage(b"%d" % i)) for i in range(3)]
    assert all(r.queued and not r.accepted for r in results)
    assert await outbox.depth() == 3 and sender.stats.queued == 3

    await clock.advance(5)  # the drainer retries with backoff; both regions still down
    assert await outbox.depth() == 3

    secondary.restore()
    await clock.advance(10)
    assert await outbox.depth() == 0
    assert [m.body for m in secondary.accepted] == [b"0", b"1", b"2"]
    assert [m.message_id for m in secondary.accepted] == [r.message_ids[0] for r in results]
    assert sender.active_region == "secondary", "the drain fails over like a send"
    await sender.aclose()


async def test_a_message_over_the_standard_limit_is_not_queued_while_no_limit_is_known(
    clock: FakeClock,
) -> None:
    """Both regions down since the sender started: their size limits are unknown. A 2 MB
    message was queued (acknowledged) and later dead-lettered in the outbox when the
    regions refused it; over the standard 256 KB it is now refused at the call, nothing
    stored. One that fits is queued as before."""
    sender, outbox, primary, secondary = queueing(clock=clock)
    down(primary, secondary)
    with pytest.raises(OversizeMessageError, match="Not queued: no region has been reached"):
        await sender.send_messages(FakeMessage(b"x" * 2_000_000))
    assert await outbox.depth() == 0
    result = await sender.send_messages(FakeMessage(b"x" * 1_000))
    assert result.queued and await outbox.depth() == 1
    await sender.aclose()


async def test_a_new_sender_drains_what_an_earlier_one_left_in_the_outbox(clock: FakeClock) -> None:
    outbox = InMemoryOutbox()
    primary, secondary = regions()
    down(primary, secondary)
    first = geo(primary, secondary, outbox=outbox, clock=clock)
    await first.send_messages(FakeMessage(b"left"))
    await first.aclose()

    up(primary, secondary)
    async with geo(primary, secondary, outbox=outbox, clock=clock):
        await clock.advance(2)
        assert [m.body for m in primary.accepted] == [b"left"]
    assert await outbox.depth() == 0


async def test_outbox_full_raises_and_stores_nothing() -> None:
    sender, outbox, primary, secondary = queueing(InMemoryOutbox(max_entries=1), clock=FakeClock())
    down(primary, secondary)
    await sender.send_messages(FakeMessage(b"1"))
    with pytest.raises(OutboxFullError):
        await sender.send_messages(FakeMessage(b"2"))
    assert await outbox.depth() == 1
    await sender.aclose()


async def test_a_refused_outbox_entry_does_not_block_the_others(clock: FakeClock) -> None:
    outbox = InMemoryOutbox()
    primary, secondary = regions()
    sender = geo(primary, secondary, outbox=outbox, clock=clock)
    channel = sender.channel
    codec = primary.codec
    await outbox.put(
        channel,
        [("nowhere", codec.encode(FakeMessage(b"bad"))), (None, codec.encode(FakeMessage(b"ok")))],
        now=clock.time(),
    )
    assert await sender.drain_outbox() == 1
    assert [m.body for m in primary.accepted] == [b"ok"]
    assert await outbox.depth() == 0
    [dead] = await outbox.records(dead=True)
    assert dead.reason == "InvalidMessageError", "a refused entry is kept aside, never dropped"
    assert sender.stats.dead_lettered == 1
    await sender.aclose()


# ------------------------------------------------------------------------ input checks


async def test_a_missing_dedup_subject_is_refused_before_anything_is_sent() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, dedup_key=DedupKey.SUBJECT)
    with pytest.raises(InvalidMessageError, match="subject"):
        await sender.send_messages([FakeMessage(b"a", subject="s"), FakeMessage(b"b")])
    assert primary.attempts == 0


async def test_dedup_on_an_application_property() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active", dedup_key=DedupKey.application_property("k"))
    with pytest.raises(InvalidMessageError, match="'k'"):
        await sender.send_messages(FakeMessage(b"a"))
    await sender.send_messages(FakeMessage(b"a", application_properties={"k": "v"}))
    assert secondary.accepted[0].application_properties["k"] == "v"


def test_configuration_errors_name_the_problem() -> None:
    with pytest.raises(ConfigurationError, match="same namespace"):
        GeoSender(
            InMemoryRegionSender("primary", "east"), InMemoryRegionSender("secondary", "east")
        )
    with pytest.raises(ConfigurationError, match="outbox"):
        GeoSender(*regions(), mode="active", repair=True)
    with pytest.raises(ConfigurationError, match="attempt_timeout"):
        FailoverPolicy(attempt_timeout=0)
    with pytest.raises(ConfigurationError, match="name"):
        DedupKey("application_property")


# ------------------------------------------------------------------ batches, schedules


async def test_batches_fit_both_regions_and_their_messages_get_ids() -> None:
    primary = InMemoryRegionSender("primary", "east", max_message_size=1000)
    secondary = InMemoryRegionSender("secondary", "west", max_message_size=600)
    sender = geo(primary, secondary, mode="active")

    batch = await sender.create_message_batch()
    assert batch.max_size_in_bytes == 600
    batch.add_message(FakeMessage(b"a" * 10))
    batch.add_message(FakeMessage(b"b" * 10))
    assert all(m.message_id for m in batch.messages)

    result = await sender.send_messages(batch)
    assert set(result.accepted) == {"primary", "secondary"}
    assert [m.message_id for m in primary.accepted] == [m.message_id for m in secondary.accepted]
    assert result.message_ids == tuple(m.message_id for m in batch.messages)


@pytest.mark.parametrize("mode", ["active", "passive"])
async def test_schedule_returns_a_list_and_cancel_takes_it_back_as_the_sdk_does(mode: str) -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode=mode)
    when = datetime(2030, 1, 1, tzinfo=UTC)
    secondary.scheduled[99] = FakeMessage(b"offset")  # the regions' numbers differ

    numbers = await sender.schedule_messages([FakeMessage(b"a"), FakeMessage(b"b")], when)
    assert isinstance(numbers, list) and len(numbers) == 2
    assert all(isinstance(n, int) for n in numbers)
    await sender.cancel_scheduled_messages(numbers)
    assert primary.scheduled == {} and list(secondary.scheduled) == [99]

    [one] = await sender.schedule_messages(FakeMessage(b"c"), when)
    await sender.cancel_scheduled_messages(one)  # a single number, as the SDK takes
    assert primary.scheduled == {} and list(secondary.scheduled) == [99]


async def test_cancelling_something_not_a_number_raises_and_cancels_nothing() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    [number] = await sender.schedule_messages(FakeMessage(b"a"), datetime(2030, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidMessageError, match="a sequence number is an int"):
        await sender.cancel_scheduled_messages([number, "7"])  # type: ignore[list-item]
    assert len(primary.scheduled) == 1 and len(secondary.scheduled) == 1
    await sender.cancel_scheduled_messages([number])
    assert primary.scheduled == {} and secondary.scheduled == {}


async def test_a_schedule_time_that_is_not_a_datetime_is_refused_before_any_call() -> None:
    """The SDK raises a ServiceBusError for it (it cannot encode the time); georep's error
    is that too, and a TypeError and a ValueError, and names the fix."""
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    with pytest.raises(InvalidMessageError, match="must be a datetime") as raised:
        await sender.schedule_messages(FakeMessage(b"a"), "tomorrow")  # type: ignore[arg-type]
    assert isinstance(raised.value, azure_exceptions.ServiceBusError)
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)
    assert primary.attempts == secondary.attempts == 0


@pytest.mark.parametrize("operation", ["schedule", "cancel"])
async def test_a_call_both_regions_refuse_raises_the_refusal_not_an_outage(operation: str) -> None:
    """Active mode: when both regions refuse a schedule or a cancel itself (a wrong key, a
    bad argument), the primary's refusal is raised, as the SDK raises its namespace's:
    not AllRegionsUnavailableError (a ServiceBusConnectionError) for regions that answered."""
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    when = datetime(2030, 1, 1, tzinfo=UTC)
    numbers = await sender.schedule_messages(FakeMessage(b"a"), when)
    for region in (primary, secondary):
        region.fail_with(ErrorKind.AUTHENTICATION)
    with pytest.raises(AuthenticationError) as raised:
        if operation == "schedule":
            await sender.schedule_messages(FakeMessage(b"b"), when)
        else:
            await sender.cancel_scheduled_messages(numbers)
    assert raised.value.region == "primary"
    assert not isinstance(raised.value, azure_exceptions.ServiceBusConnectionError)


async def test_a_cancel_that_failed_in_one_region_can_be_retried_until_it_succeeds() -> None:
    """Active mode: a cancel during the secondary's outage cancels the primary's copy and
    raises the secondary's error. The service refuses a number it no longer holds
    ("Messages not found"), so a retry once the secondary is back used to fail on the
    primary's copy, for ever. The retry now succeeds, and the message is gone from both;
    a number no region holds any more is still refused, as the SDK refuses it."""
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    [number] = await sender.schedule_messages(FakeMessage(b"a"), datetime(2030, 1, 1, tzinfo=UTC))
    secondary.fail_with(ErrorKind.CONNECTION)
    with pytest.raises(RegionUnavailableError):
        await sender.cancel_scheduled_messages(number)
    assert primary.scheduled == {} and len(secondary.scheduled) == 1
    secondary.restore()
    await sender.cancel_scheduled_messages(number)
    assert primary.scheduled == {} and secondary.scheduled == {}
    with pytest.raises(MessageNotFoundError):
        await sender.cancel_scheduled_messages(number)


async def test_per_region_numbers_and_the_deprecated_mapping_form() -> None:
    primary, secondary = regions()
    sender = geo(primary, secondary, mode="active")
    when = datetime(2030, 1, 1, tzinfo=UTC)
    by_region = await sender.schedule_messages_by_region([FakeMessage(b"a")], when)
    assert set(by_region) == {"primary", "secondary"}
    with pytest.warns(DeprecationWarning, match="deprecated"):
        await sender.cancel_scheduled_messages(by_region)
    assert primary.scheduled == {} and secondary.scheduled == {}
    by_region = await sender.schedule_messages_by_region([FakeMessage(b"b")], when)
    await sender.cancel_scheduled_messages_by_region(by_region)
    assert primary.scheduled == {} and secondary.scheduled == {}


async def test_passive_schedule_fails_over_and_returns_the_backups_numbers_flagged() -> None:
    from georep.send.schedule import SECONDARY_FLAG

    primary, secondary = regions()
    sender = geo(primary, secondary)
    primary.fail_with(ErrorKind.CONNECTION)
    numbers = await sender.schedule_messages(FakeMessage(b"a"), datetime(2030, 1, 1, tzinfo=UTC))
    assert numbers == [n | SECONDARY_FLAG for n in secondary.scheduled]
    assert sender.active_region == "secondary"
    primary.restore()
    # The number names its region by itself: a sender that never saw it cancels it.
    await geo(primary, secondary).cancel_scheduled_messages(numbers)
    assert secondary.scheduled == {}


# --------------------------------------------------------------------------- lifecycle


async def test_close_is_idempotent_and_use_after_close_raises() -> None:
    primary, secondary = regions()
    async with geo(primary, secondary, outbox=InMemoryOutbox(), clock=FakeClock()) as sender:
        await sender.send_messages(FakeMessage(b"x"))
    await sender.aclose()
    await sender.close()
    with pytest.raises(ClosedError):
        await sender.send_messages(FakeMessage(b"y"))
    assert not primary.closed, "a caller's senders are never closed by georep"
    await settle()


@pytest.mark.parametrize("mode", ["passive", "active"])
async def test_a_region_that_refuses_the_message_itself_is_raised_never_queued(mode: str) -> None:
    sender, outbox, primary, secondary = queueing(mode=mode)
    primary.fail_with(ErrorKind.CONNECTION)
    secondary.fail_with(ErrorKind.MESSAGE_TOO_LARGE)
    with pytest.raises(MessageTooLargeError):
        await sender.send_messages(FakeMessage(b"x"))
    assert await outbox.depth() == 0 and sender.stats.queued == 0
    assert sender.active_region == "primary"
    await sender.aclose()


async def test_a_batch_larger_than_a_regions_limit_is_refused_as_the_sdk_refuses_it() -> None:
    """The SDK's create_message_batch raises ValueError for a size over its link's limit;
    georep's did not, and handed out a smaller batch than asked for."""
    primary = InMemoryRegionSender("primary", "east", max_message_size=1000)
    secondary = InMemoryRegionSender("secondary", "west", max_message_size=600)
    sender = geo(primary, secondary, mode="active")
    with pytest.raises(ValueError, match="601 is too large, acceptable max batch size is: 600"):
        await sender.create_message_batch(max_size_in_bytes=601)
    assert (await sender.create_message_batch(max_size_in_bytes=600)).max_size_in_bytes == 600
    assert (await sender.create_message_batch(max_size_in_bytes=0)).max_size_in_bytes == 600
    with pytest.raises(ConfigurationError, match="greater than 0"):
        await sender.create_message_batch(max_size_in_bytes=-1)


async def test_closing_lets_the_sends_under_way_finish_first(clock: FakeClock) -> None:
    """``aclose()`` while other tasks' sends are under way: they finish (each is bounded by
    its attempt deadline) before the connections close; before, they failed with the
    regions' "handler has already been shutdown", read as an outage or a wrong request."""
    primary, secondary = regions(clock=clock)
    sender = geo(primary, secondary, clock=clock, policy=FailoverPolicy(attempt_timeout=5.0))
    primary.latency = 0.2  # one call at a time per region: the fifth lands at 1.0 s
    sends = [asyncio.create_task(sender.send_messages(FakeMessage(b"x"))) for _ in range(5)]
    await clock.advance(0.5)
    closing = asyncio.create_task(sender.aclose())
    await clock.advance(0.1)
    assert not closing.done(), "the close waits for the sends"
    with pytest.raises(ClosedError):
        await sender.send_messages(FakeMessage(b"late"))  # a new one is refused at once
    await clock.advance(1.0)
    results = await asyncio.wait_for(asyncio.gather(*sends), 1)
    await asyncio.wait_for(closing, 1)
    assert all(r.accepted == ("primary",) for r in results) and len(primary.accepted) == 5


async def test_a_call_the_close_cut_short_raises_closed_error(clock: FakeClock) -> None:
    """Past the close's wait, what the closed connections raise reaches the caller as
    ClosedError (a ValueError, as the SDK's shut-down handler raises)."""
    closed = False
    flights = InFlight(lambda: closed, "the GeoSender for 'orders'")

    async def cut_short() -> None:
        raise region_error("primary: shut down", region="primary", kind=ErrorKind.CONNECTION)

    with pytest.raises(RegionError):
        await flights.track(cut_short())  # not closed: the region's error, as it is
    closed = True
    with pytest.raises(ClosedError, match="closed while this call was under way"):
        await flights.track(cut_short())
    await flights.landed(timeout=1.0, clock=clock)  # nothing under way: at once
