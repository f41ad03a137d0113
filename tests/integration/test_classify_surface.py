"""Issue 14 items 4-7 and issue 20's client-side validation, through the real SDK.

Errors that are not outages raise without failover or queueing; bad messages are refused
before any network call; PairedSender takes lists, batches and schedules through an
engaged failover; the syphon never delivers a message after its time to live; and
GeoSender's schedule/cancel are drop-in for the SDK's.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from pathlib import Path
from typing import Any

import pytest
from _helpers import (
    backlog_queues,
    drain,
    fault,
    on_emulator,
    queue_fixture,
    quick_paired_options,
    run_syphon,
    sdk_sender,
)
from azure.servicebus import ServiceBusMessage, ServiceBusMessageState, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from georep import (
    ErrorKind,
    GeoSender,
    InvalidMessageError,
    MessageTooLargeError,
    PairedNamespaceOptions,
    PairedSender,
    RegionError,
    SqliteOutbox,
    backlog_queue_path,
)
from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

UTC = datetime.UTC


queue = queue_fixture("cls")


# ----------------------------------------------------------------- classification


@pytest.mark.parametrize("mode", ["passive", "active"])
async def test_an_unclassified_service_error_raises_without_failover_or_queueing(
    emu: Emulator, queue: str, tmp_path: Path, mode: str
) -> None:
    await fault(emu, "primary", "reject_sends", "internal-error")
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        on_emulator(GeoSender, emu, queue, mode=mode, outbox=outbox) as sender,
    ):
        if mode == "passive":
            with pytest.raises(RegionError) as raised:
                await sender.send_messages(ServiceBusMessage("bug"))
            assert raised.value.kind is ErrorKind.SERVICE_ERROR
            assert sender.active_region == "primary" and sender.stats.role_swaps == 0
        else:
            # Active: the other copy is accepted; the refused one is not queued for repair.
            result = await sender.send_messages(ServiceBusMessage("bug"))
            assert result.accepted == ("secondary",) and not result.repair_queued
            assert result.failed["primary"].kind is ErrorKind.SERVICE_ERROR  # type: ignore[attr-defined]
        assert await outbox.depth() == 0
    expected = 0 if mode == "passive" else 1
    assert emu.namespace("secondary").message_count(queue) == expected


async def test_server_busy_fails_over_by_default(emu: Emulator, queue: str) -> None:
    await fault(emu, "primary", "reject_sends", "server-busy")
    async with on_emulator(GeoSender, emu, queue) as sender:
        result = await sender.send_messages(ServiceBusMessage("busy"))
    assert result.failed_over and result.accepted == ("secondary",)


async def test_bad_messages_are_refused_before_any_network_call(
    emu: Emulator, queue: str, tmp_path: Path
) -> None:
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        on_emulator(GeoSender, emu, queue, outbox=outbox) as sender,
    ):
        await fault(emu, "primary", "outage")  # the case that used to queue them forever
        bad: list[Any] = [
            ServiceBusMessage(b"x" * 300_000),  # over the learned 256 KB limit
            {"body": b"x", "message_id": b"\xff\xfe"},
            {"body": b"x", "sesion_id": "typo"},
        ]
        odd = ServiceBusMessage(b"x", message_id="placeholder")
        odd.raw_amqp_message.properties.message_id = "bad-\udcff"  # type: ignore[union-attr]
        bad.append(odd)
        for message in bad:
            with pytest.raises(InvalidMessageError):
                await sender.send_messages(message)
        assert await outbox.depth() == 0 and sender.stats.queued == 0
    assert emu.namespace("secondary").message_count(queue) == 0


@pytest.mark.parametrize("mode", ["passive", "active"])
async def test_primary_down_and_a_message_the_backup_refuses_is_raised_not_queued(
    emu: Emulator, queue: str, tmp_path: Path, mode: str
) -> None:
    """Issue 20: the size limit is not known yet (no warm-up), so the backup refuses it."""
    outbox = SqliteOutbox(tmp_path / "outbox.db")
    sender = on_emulator(GeoSender, emu, queue, mode=mode, outbox=outbox)
    try:
        await fault(emu, "primary", "outage")
        with pytest.raises(MessageTooLargeError):
            await sender.send_messages(ServiceBusMessage(b"x" * 300_000))
        assert await outbox.depth() == 0 and sender.stats.queued == 0
    finally:
        await sender.aclose()
        await outbox.aclose()


async def test_the_sdks_client_side_unicode_error_is_not_an_outage(
    emu: Emulator, queue: str
) -> None:
    """Past georep's own check (as a region adapter is called), the SDK's wrapped
    UnicodeEncodeError is classified as the request's fault, not a service error."""
    from georep.adapters.servicebus import open_region_sender

    region = open_region_sender(
        emu.connection_string("primary"), region="primary", queue_name=queue
    )
    try:
        message = ServiceBusMessage(b"x", message_id="placeholder")
        message.raw_amqp_message.properties.message_id = "bad-\udcff"  # type: ignore[union-attr]
        with pytest.raises(RegionError) as raised:
            await region.send(message, timeout=10)
        assert raised.value.kind is ErrorKind.INVALID_ARGUMENT
        assert not raised.value.retryable
        # The SDK wraps it ("Handler failed"), which used to read as a service error.
        cause = raised.value.__cause__
        assert type(cause).__name__ == "ServiceBusError"
        assert isinstance(getattr(cause, "inner_exception", None), UnicodeEncodeError)
    finally:
        await region.close()


# ------------------------------------------------------------------------ paired


async def paired_setup(
    emu: Emulator, queue: str, count: int = 2
) -> tuple[PairedNamespaceOptions, str]:
    options = quick_paired_options(count)
    primary_name, _ = await backlog_queues(emu, options, f"cls{uuid.uuid4().hex[:6]}")
    return options, primary_name


async def test_paired_lists_batches_and_schedules_through_an_engaged_failover(
    emu: Emulator, queue: str
) -> None:
    options, primary_name = await paired_setup(emu, queue)
    when = datetime.datetime.now(UTC) + datetime.timedelta(seconds=4)
    async with on_emulator(
        PairedSender, emu, queue, primary_namespace=primary_name, options=options
    ) as sender:
        # Healthy: a list, a batch and a schedule go to the primary.
        assert await sender.send_messages([ServiceBusMessage("p1"), ServiceBusMessage("p2")]) == (
            "primary"
        )
        numbers = await sender.schedule_messages(ServiceBusMessage("p-cancelled"), when)
        assert len(numbers) == 1
        await sender.cancel_scheduled_messages(numbers)

        await fault(emu, "primary", "outage")
        # failover_interval 0: the first failure engages failover.
        assert await sender.send_messages(ServiceBusMessage("first")) != "primary"
        assert sender.state.engaged
        listed = [ServiceBusMessage(f"l{i}", session_id="s") for i in range(3)]
        assert await sender.send_messages(listed) != "primary"
        async with ServiceBusClient.from_connection_string(
            emu.connection_string("secondary")
        ) as client:
            batch = await client.get_queue_sender(
                backlog_queue_path(primary_name, 0)
            ).create_message_batch()
        batch.add_message(ServiceBusMessage("b1"))
        batch.add_message(ServiceBusMessage("b2"))
        assert await sender.send_messages(batch) != "primary"
        # Far enough out that the syphon finishes well before it, even on a loaded CI machine;
        # the test reads the scheduled copy by peeking, so it never waits for this time.
        later_at = datetime.datetime.now(UTC) + datetime.timedelta(seconds=120)
        assert await sender.schedule_messages([ServiceBusMessage("later")], later_at) == []
        await fault(emu, "primary", "restore")

    syphon = await run_syphon(emu, primary_name, options, lambda s: s.stats.moved >= 7)
    assert syphon.stats.dead_lettered == 0
    assert datetime.datetime.now(UTC) < later_at - datetime.timedelta(seconds=1.5)
    now = [m for m in await drain(emu, "primary", queue, wait=0.5)]
    bodies = sorted(b"".join(m.body).decode() for m in now)
    assert bodies == ["b1", "b2", "first", "l0", "l1", "l2", "p1", "p2"], "the scheduled one waits"
    assert {m.session_id for m in now if b"".join(m.body).startswith(b"l")} == {"s"}
    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        [later] = await receiver.peek_messages(max_message_count=10)
    assert b"".join(later.body) == b"later"
    assert later.state == ServiceBusMessageState.SCHEDULED
    assert later.scheduled_enqueue_time_utc == later_at.replace(
        microsecond=later_at.microsecond // 1000 * 1000
    ), "the schedule survived the backlog"


async def test_the_syphon_never_delivers_a_message_after_its_time_to_live(
    emu: Emulator, queue: str
) -> None:
    options, primary_name = await paired_setup(emu, queue, count=1)
    async with on_emulator(
        PairedSender, emu, queue, primary_namespace=primary_name, options=options
    ) as sender:
        await fault(emu, "primary", "outage")
        await sender.send_messages(ServiceBusMessage("engage", message_id="engage"))
        short = ServiceBusMessage(
            "short", message_id="short", time_to_live=datetime.timedelta(seconds=2)
        )
        long = ServiceBusMessage(
            "long", message_id="long", time_to_live=datetime.timedelta(seconds=60)
        )
        await sender.send_messages(short)
        await sender.send_messages(long)
        await fault(emu, "primary", "restore")
    await asyncio.sleep(3)  # the short one's TTL runs out in the backlog queue

    syphon = await run_syphon(
        emu, primary_name, options, lambda s: s.stats.moved + s.stats.expired >= 3
    )
    assert syphon.stats.expired == 1 and syphon.stats.moved == 2
    home = {m.message_id: m for m in await drain(emu, "primary", queue)}
    assert sorted(home) == ["engage", "long"], "the expired one is never delivered"
    home = home["long"]
    assert home.message_id == "long"
    assert datetime.timedelta(seconds=50) < home.time_to_live < datetime.timedelta(seconds=57.5), (
        "the time spent in the backlog was subtracted"
    )
    [dead] = await drain(
        emu,
        "secondary",
        backlog_queue_path(primary_name, 0),
        sub_queue=ServiceBusSubQueue.DEAD_LETTER,
    )
    assert dead.message_id == "short" and dead.dead_letter_reason == "TTLExpiredException"


# ----------------------------------------------------------------- drop-in names


async def schedule_then_cancel(sender: Any) -> None:
    """The SDK's documented usage, word for word: schedule, then cancel the returned list."""
    scheduled_time_utc = datetime.datetime.utcnow() + datetime.timedelta(seconds=3)
    messages = [ServiceBusMessage(f"Message no. {i}") for i in range(3)]
    sequence_numbers = await sender.schedule_messages(messages, scheduled_time_utc)
    assert len(sequence_numbers) == 3 and all(isinstance(n, int) for n in sequence_numbers)
    await sender.cancel_scheduled_messages(sequence_numbers)
    [one] = await sender.schedule_messages(ServiceBusMessage("single"), scheduled_time_utc)
    await sender.cancel_scheduled_messages(one)


@pytest.mark.parametrize("which", ["sdk", "passive", "active"])
async def test_schedule_and_cancel_are_drop_in(emu: Emulator, queue: str, which: str) -> None:
    # Offset the secondary's sequence numbers so that the regions' numbers differ.
    async with sdk_sender(emu.connection_string("secondary"), queue) as offset:
        await offset.send_messages([ServiceBusMessage("offset") for _ in range(5)])
    await drain(emu, "secondary", queue, wait=0.5)

    if which == "sdk":
        async with sdk_sender(emu.connection_string("primary"), queue) as raw_sender:
            await schedule_then_cancel(raw_sender)
    else:
        async with on_emulator(GeoSender, emu, queue, mode=which) as sender:
            await schedule_then_cancel(sender)
    for namespace in emu.namespaces:
        assert emu.namespace(namespace).message_count(queue) == 0, f"{namespace} kept one"
    await asyncio.sleep(3.5)
    for namespace in emu.namespaces:
        assert await drain(emu, namespace, queue, wait=0.5) == [], "a cancelled one arrived"
