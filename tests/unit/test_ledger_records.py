"""What GeoSender, PairedSender and GeoReceiver write to a ledger, in each situation."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from _receivers import ReceiverWorld

from georep import (
    AllRegionsUnavailableError,
    AuthenticationError,
    ErrorKind,
    FailoverPolicy,
    GeoReceiver,
    GeoSender,
    PairedNamespaceOptions,
    PairedSender,
    RoleState,
    receiver,
)
from georep.ledger.schema import RECEIVE_COLUMNS, SEND_COLUMNS
from georep.ports import Ledger, ReceiveRecord, RegionAttempt, SendRecord
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryLedger,
    InMemoryOutbox,
    InMemoryRegionSender,
)


class Rig:
    """Two in-memory regions, an in-memory ledger and a fake clock."""

    def __init__(
        self, *, primary_fails: ErrorKind | None = None, secondary_fails: ErrorKind | None = None
    ) -> None:
        self.clock = FakeClock()
        self.ledger = InMemoryLedger()
        self.primary = InMemoryRegionSender("primary", "east.example", clock=self.clock)
        self.secondary = InMemoryRegionSender("secondary", "west.example", clock=self.clock)
        if primary_fails is not None:
            self.primary.fail_with(primary_fails)
        if secondary_fails is not None:
            self.secondary.fail_with(secondary_fails)

    def sender(self, **kwargs: Any) -> GeoSender:
        return GeoSender(
            self.primary,
            self.secondary,
            ledger=self.ledger,
            clock=self.clock,
            role_state=RoleState(self.primary.namespace),
            **kwargs,
        )


def tried(row: dict[str, Any]) -> list[tuple[str | None, str]]:
    return [(attempt["region"], attempt["outcome"]) for attempt in row["regions"]]


def at(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.time() + offset, UTC)


def test_the_in_memory_ledger_is_a_ledger_and_its_rows_have_the_schema_columns() -> None:
    ledger = InMemoryLedger()
    assert isinstance(ledger, Ledger)
    clock = FakeClock()
    ledger.record_send(
        SendRecord(("a", "b"), "orders", "passive", "accepted", "primary", False, [], 1.0, 2.0)
    )
    ledger.record_receive(
        ReceiveRecord("a", "orders", "primary", "processed", 1, None, clock.time(), None)
    )
    assert [list(row) for row in ledger.send_rows] == [[c[0] for c in SEND_COLUMNS]] * 2
    assert list(ledger.receive_rows[0]) == [c[0] for c in RECEIVE_COLUMNS]


# ------------------------------------------------------------------------------ senders


async def test_a_passive_send_writes_one_accepted_row_per_message() -> None:
    rig = Rig()
    rig.primary.latency = 0.25
    sender = rig.sender()
    started = at(rig.clock)

    task = asyncio.create_task(sender.send_messages([FakeMessage(b"a"), FakeMessage(b"b")]))
    await rig.clock.advance(0.25)
    result = await task

    rows = rig.ledger.send_rows
    assert [row["message_id"] for row in rows] == list(result.message_ids)
    for row in rows:
        assert row["entity"] == "orders" and row["mode"] == "passive"
        assert row["outcome"] == "accepted" and row["accepted_region"] == "primary"
        assert row["failover"] is False
        assert row["regions"] == [{"region": "primary", "outcome": "accepted", "error": None}]
        assert row["started_at"] == started and row["finished_at"] == at(rig.clock)
        assert row["schema_version"] == 1


async def test_a_passive_failover_writes_the_failed_region_then_the_accepting_one() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION)

    result = await rig.sender().send_messages(FakeMessage(b"a"))

    [row] = rig.ledger.send_rows
    assert row["message_id"] == result.message_ids[0]
    assert row["outcome"] == "accepted" and row["accepted_region"] == "secondary"
    assert row["failover"] is True
    assert row["regions"] == [
        {"region": "primary", "outcome": "failed", "error": "RegionUnavailableError"},
        {"region": "secondary", "outcome": "accepted", "error": None},
    ]


async def test_a_passive_send_that_raises_writes_a_failed_row() -> None:
    rig = Rig(primary_fails=ErrorKind.AUTHENTICATION)

    with pytest.raises(AuthenticationError):
        await rig.sender().send_messages(FakeMessage(b"a", message_id="m-1"))

    [row] = rig.ledger.send_rows
    assert row["message_id"] == "m-1" and row["outcome"] == "failed"
    assert row["accepted_region"] is None and row["failover"] is False
    assert row["regions"] == [
        {"region": "primary", "outcome": "failed", "error": "CredentialsRefusedError"}
    ]


async def test_both_regions_down_without_an_outbox_writes_failed_rows() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION, secondary_fails=ErrorKind.TIMEOUT)

    with pytest.raises(AllRegionsUnavailableError):
        await rig.sender().send_messages([FakeMessage(b"a", "m-1"), FakeMessage(b"b", "m-2")])

    rows = rig.ledger.send_rows
    assert [row["message_id"] for row in rows] == ["m-1", "m-2"]
    assert {row["outcome"] for row in rows} == {"failed"}
    assert tried(rows[0]) == [("primary", "failed"), ("secondary", "failed")]


async def test_both_regions_down_with_an_outbox_writes_queued_rows() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION, secondary_fails=ErrorKind.CONNECTION)
    sender = rig.sender(outbox=InMemoryOutbox())

    result = await sender.send_messages(FakeMessage(b"a"))

    assert result.queued
    [row] = rig.ledger.send_rows
    assert row["outcome"] == "queued" and row["accepted_region"] is None
    assert row["failover"] is False
    assert row["regions"] == [
        {"region": "primary", "outcome": "failed", "error": "RegionUnavailableError"},
        {"region": "secondary", "outcome": "failed", "error": "RegionUnavailableError"},
        {"region": None, "outcome": "queued", "error": None},
    ]
    await sender.aclose()


async def test_an_active_send_with_both_regions_up_lists_both_as_accepted() -> None:
    rig = Rig()

    await rig.sender(mode="active").send_messages(FakeMessage(b"a"))

    [row] = rig.ledger.send_rows
    assert row["mode"] == "active" and row["outcome"] == "accepted"
    assert row["accepted_region"] == "primary" and row["failover"] is False
    assert tried(row) == [("primary", "accepted"), ("secondary", "accepted")]


async def test_active_with_one_region_down_records_failed_then_skipped_and_repair() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION)
    sender = rig.sender(
        mode="active",
        policy=FailoverPolicy(region_cooldown=5),
        outbox=InMemoryOutbox(),
        repair=True,
    )

    await sender.send_messages(FakeMessage(b"tried"))
    await sender.send_messages(FakeMessage(b"skipped"))  # primary cooling down

    first, second = rig.ledger.send_rows
    for row in (first, second):
        assert row["outcome"] == "accepted" and row["accepted_region"] == "secondary"
        assert row["failover"] is True
    assert first["regions"] == [
        {"region": "primary", "outcome": "failed", "error": "RegionUnavailableError"},
        {"region": "secondary", "outcome": "accepted", "error": None},
        {"region": "primary", "outcome": "queued", "error": None},
    ]
    assert second["regions"][0] == {
        "region": "primary",
        "outcome": "skipped",
        "error": "RegionUnavailableError",
    }
    await sender.aclose()


async def test_active_with_both_regions_down_and_an_outbox_queues_for_each_region() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION, secondary_fails=ErrorKind.TIMEOUT)
    sender = rig.sender(mode="active", outbox=InMemoryOutbox())

    await sender.send_messages(FakeMessage(b"a"))

    [row] = rig.ledger.send_rows
    assert row["outcome"] == "queued" and row["failover"] is False
    assert tried(row) == [
        ("primary", "failed"),
        ("secondary", "failed"),
        ("primary", "queued"),
        ("secondary", "queued"),
    ]
    await sender.aclose()


async def test_active_with_both_regions_down_without_an_outbox_writes_failed_rows() -> None:
    rig = Rig(primary_fails=ErrorKind.CONNECTION, secondary_fails=ErrorKind.CONNECTION)

    with pytest.raises(AllRegionsUnavailableError):
        await rig.sender(mode="active").send_messages(FakeMessage(b"a"))

    [row] = rig.ledger.send_rows
    assert row["outcome"] == "failed" and row["accepted_region"] is None
    assert tried(row) == [("primary", "failed"), ("secondary", "failed")]


async def test_closing_a_sender_flushes_its_ledger_but_does_not_close_it() -> None:
    rig = Rig()
    sender = rig.sender()
    await sender.send_messages(FakeMessage(b"a"))

    await sender.aclose()
    await sender.aclose()

    assert rig.ledger.flushes == 1 and not rig.ledger.closed


async def test_a_paired_send_records_the_primary_then_the_backlog_queue() -> None:
    clock = FakeClock()
    ledger = InMemoryLedger()
    primary = InMemoryRegionSender("primary", "east.example", "orders", clock=clock)
    backlog = [
        InMemoryRegionSender(f"backlog-{i}", "west.example", f"east/x-servicebus-transfer/{i}")
        for i in range(2)
    ]
    backlog[0].fail_with(ErrorKind.CONNECTION)
    options = PairedNamespaceOptions(backlog_queue_count=2, failover_interval=0)
    paired = PairedSender(
        primary,
        backlog,
        rewrite=lambda message, destination: message,
        make_ping=lambda: FakeMessage(b""),
        options=options,
        secondary_namespace="west.example",
        rng=random.Random(0),
        ledger=ledger,
        clock=clock,
    )

    await paired.send_messages(FakeMessage(b"ok", "m-1"))
    primary.fail_with(ErrorKind.CONNECTION)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paired._rng, "choice", lambda candidates: candidates[0])
        await paired.send_messages(FakeMessage(b"down", "m-2"))
    await paired.aclose()

    normal, failed_over = ledger.send_rows
    assert normal["mode"] == "paired" and normal["accepted_region"] == "primary"
    assert normal["failover"] is False
    assert failed_over["message_id"] == "m-2" and failed_over["failover"] is True
    assert failed_over["accepted_region"] == "backlog-1"
    assert tried(failed_over) == [
        ("primary", "failed"),
        ("backlog-0", "failed"),
        ("backlog-1", "accepted"),
    ]
    assert ledger.flushes == 1


# ----------------------------------------------------------------------------- receiver


class World(ReceiverWorld):
    def __init__(self) -> None:
        super().__init__()
        self.primary, self.secondary = self.regions()
        self.ledger = InMemoryLedger()

    def receiver(self) -> GeoReceiver:
        return self.geo(self.primary, self.secondary, ledger=self.ledger)

    async def run_for(self, geo: GeoReceiver, seconds: float, handler: Any) -> None:
        task = asyncio.create_task(geo.run(handler))
        await self.clock.advance(seconds)
        closing = asyncio.create_task(geo.aclose())
        await self.clock.advance(5)
        await asyncio.wait_for(closing, 1)
        await asyncio.wait_for(task, 1)


async def test_twins_write_one_processed_and_one_suppressed_row() -> None:
    world = World()
    world.primary.put(FakeMessage(b"x", "a"))
    world.secondary.put(FakeMessage(b"x", "a"))
    geo = world.receiver()
    received_at = at(world.clock)

    async def handle(message: Any) -> None:
        await world.clock.sleep(0.5)

    await world.run_for(geo, 3, handle)

    rows = sorted(world.ledger.receive_rows, key=lambda row: row["outcome"])
    assert [(r["message_id"], r["outcome"]) for r in rows] == [
        ("a", "processed"),
        ("a", "suppressed"),
    ]
    assert {r["region"] for r in rows} == {"primary", "secondary"}
    for row in rows:
        assert row["entity"] == "orders" and row["delivery_count"] == 1
        assert row["received_at"] == received_at
        assert row["settled_at"] is not None and row["settled_at"] >= row["received_at"]
    processed = rows[0]
    assert (processed["settled_at"] - processed["received_at"]).total_seconds() == 0.5
    assert world.ledger.flushes == 1 and not world.ledger.closed


async def test_a_failed_handler_writes_a_failed_row_then_a_processed_one_on_redelivery() -> None:
    world = World()
    world.primary.put(FakeMessage(b"x", "flaky"))
    calls = 0

    async def flaky(message: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first time fails")

    await world.run_for(world.receiver(), 5, flaky)

    rows = world.ledger.receive_rows
    assert [(r["outcome"], r["delivery_count"]) for r in rows] == [
        ("failed", 1),
        ("processed", 2),
    ]
    assert all(r["settled_at"] is not None for r in rows)


async def test_the_decorator_passes_the_ledger_and_flushes_it_on_close() -> None:
    world = World()
    world.primary.put(FakeMessage(b"x", "a"))

    @receiver(
        primary=world.primary,
        secondary=world.secondary,
        seen=world.seen,
        ledger=world.ledger,
        clock=world.clock,
        max_wait=1.0,
    )
    async def handle(message: Any) -> None:
        return None

    task = asyncio.create_task(handle.run())
    await world.clock.advance(3)
    closing = asyncio.create_task(handle.aclose())
    await world.clock.advance(5)
    await asyncio.wait_for(closing, 1)
    await asyncio.wait_for(task, 1)

    assert [(r["message_id"], r["outcome"]) for r in world.ledger.receive_rows] == [
        ("a", "processed")
    ]
    assert world.ledger.flushes == 1


def test_region_attempts_are_plain_tuples_in_struct_field_order() -> None:
    assert tuple(RegionAttempt("primary", "failed", "X")) == ("primary", "failed", "X")
