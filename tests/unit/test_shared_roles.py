"""Roles shared through a role store, by several "processes" (each its own RoleState and
link, as separate processes have) on the in-memory store and a fake clock."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import weakref

import pytest
from _metrics import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from georep import (
    ConfigurationError,
    Corroboration,
    ErrorKind,
    FailoverChannel,
    FailoverPolicy,
    GeoSender,
    PairedNamespaceOptions,
    PairedSender,
    RoleState,
)
from georep._lifecycle import STOP_TIMEOUT
from georep.ports import RoleRecord
from georep.roles import store as role_store_module
from georep.roles.commands import RoleCommands
from georep.roles.store import SharedRoles
from georep.testing import (
    FakeClock,
    FakeMessage,
    InMemoryRegionSender,
    InMemoryRelayEndpoint,
    InMemoryRoleStore,
    settle,
)

ENTITY = "orders"
NAMES = {"primary": "east.example", "secondary": "west.example"}


class Process:
    """One sender process: its regions, its own role state linked to the shared store."""

    def __init__(
        self,
        store: InMemoryRoleStore,
        clock: FakeClock,
        *,
        meter_provider: MeterProvider | None = None,
        **kwargs: object,
    ) -> None:
        self.primary = InMemoryRegionSender("primary", NAMES["primary"], ENTITY)
        self.secondary = InMemoryRegionSender("secondary", NAMES["secondary"], ENTITY)
        self.link = SharedRoles(
            store,
            ENTITY,
            RoleState(NAMES["primary"]),
            names=NAMES,
            clock=clock,
            meter_provider=meter_provider,
        )
        self.link.reporter = f"test process {id(self)}"  # one OS process plays them all
        self.sender = GeoSender(
            self.primary, self.secondary, role_state=self.link.state, clock=clock, **kwargs
        )

    @property
    def active(self) -> str:
        return self.sender.active_region

    async def start(self) -> None:
        """Join the store and open both regions' links, as ``async with`` does (a process
        that never reached a region cannot move the others: see the corroboration tests)."""
        await self.link.refresh()
        self.link.hold()
        await self.sender.warm_up()

    async def stop(self) -> None:
        await self.link.release()
        await self.sender.aclose()


async def fleet(
    count: int, store: InMemoryRoleStore, clock: FakeClock, **kwargs: object
) -> list[Process]:
    processes = [Process(store, clock, **kwargs) for _ in range(count)]
    for process in processes:
        await process.start()
    return processes


async def test_racing_failovers_swap_the_shared_roles_in_one_generation_step() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    processes = await fleet(8, store, clock)
    for process in processes:
        process.primary.fail_with(ErrorKind.CONNECTION)

    results = await asyncio.gather(
        *(p.sender.send_messages(FakeMessage(b"x")) for p in processes for _ in range(3))
    )

    assert all(r.accepted == ("secondary",) for r in results)
    assert store.records[ENTITY].generation == 1
    assert store.records[ENTITY].active == "secondary"
    assert sum(p.sender.roles.swaps for p in processes) == 1
    assert {p.active for p in processes} == {"secondary"}


async def test_a_failure_seen_by_one_process_moves_the_others_within_a_refresh() -> None:
    store, clock = InMemoryRoleStore(refresh_interval=0.25), FakeClock()
    first, *others = await fleet(4, store, clock)
    first.primary.fail_with(ErrorKind.CONNECTION)

    await first.sender.send_messages(FakeMessage(b"x"))
    assert first.active == "secondary"
    assert {p.active for p in others} == {"primary"}
    await clock.advance(0.25)

    assert {p.active for p in others} == {"secondary"}
    attempts = others[0].primary.attempts
    await others[0].sender.send_messages(FakeMessage(b"y"))
    assert others[0].primary.attempts == attempts  # straight to the new active region
    assert store.records[ENTITY].generation == 1


async def test_a_late_process_sees_the_stale_roles_lose_and_follows_the_winner() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    first, second = await fleet(2, store, clock)
    first.primary.fail_with(ErrorKind.CONNECTION)
    second.primary.fail_with(ErrorKind.CONNECTION)
    await first.sender.send_messages(FakeMessage(b"x"))

    # Before its next refresh the second still thinks the primary is active.
    result = await second.sender.send_messages(FakeMessage(b"y"))

    assert result.accepted == ("secondary",)
    assert second.sender.roles.swaps == 0 and second.active == "secondary"
    assert store.records[ENTITY].generation == 1


async def test_failback_happens_once_after_the_primary_was_healthy_long_enough() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(switch_back=True, switch_back_probe_interval=5, failback_after=30)
    processes = await fleet(3, store, clock, policy=policy)
    for process in processes:
        process.primary.fail_with(ErrorKind.CONNECTION)
    await processes[0].sender.send_messages(FakeMessage(b"x"))
    await clock.advance(0.25)
    for process in processes:
        process.primary.restore()

    await clock.advance(25)  # every process's probe answered, but not for 30 s yet
    assert store.records[ENTITY].generation == 1
    assert {p.active for p in processes} == {"secondary"}
    await clock.advance(10)
    await clock.advance(0.25)

    assert store.records[ENTITY].generation == 2
    assert store.records[ENTITY].active == "primary"
    assert {p.active for p in processes} == {"primary"}
    assert sum(p.sender.stats.role_swaps for p in processes) == 2  # the failover, one failback


async def test_pinned_roles_refuse_automatic_swaps() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    processes = await fleet(2, store, clock)
    await RoleCommands(store, app="test").pin("primary", [ENTITY])
    await clock.advance(0.25)
    processes[0].primary.fail_with(ErrorKind.CONNECTION)

    result = await processes[0].sender.send_messages(FakeMessage(b"x"))

    assert result.accepted == ("secondary",)  # the message still goes to the backup
    assert store.records[ENTITY].active == "primary" and store.records[ENTITY].pinned
    assert store.records[ENTITY].generation == 0
    assert processes[0].active == "primary" and processes[0].sender.roles.swaps == 0


async def test_an_operator_failover_moves_every_process_and_is_not_failed_back() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(switch_back=True, switch_back_probe_interval=1, failback_after=2)
    processes = await fleet(3, store, clock, policy=policy)
    commands = RoleCommands(store, app="test")

    [change] = await commands.failover("secondary")
    await clock.advance(0.25)

    assert change.changed and change.after.generation == 1 and not change.after.automatic
    assert "georep failover" in change.after.changed_by
    assert {p.active for p in processes} == {"secondary"}
    await clock.advance(10)  # the primary is healthy, but an operator chose the secondary
    assert {p.active for p in processes} == {"secondary"}

    await commands.failback()
    await clock.advance(0.25)
    assert {p.active for p in processes} == {"primary"}
    assert store.records[ENTITY].generation == 2


async def test_operator_commands_refuse_bad_input_with_the_fix() -> None:
    store = InMemoryRoleStore()
    commands = RoleCommands(store, app="test")
    with pytest.raises(ConfigurationError, match="unknown region 'tertiary'"):
        await commands.failover("tertiary", [ENTITY])
    with pytest.raises(ConfigurationError, match="--entity"):
        await commands.failover("secondary")
    await commands.pin("primary", [ENTITY], force=True)
    with pytest.raises(ConfigurationError, match="georep unpin"):
        await commands.failover("secondary", [ENTITY])
    [unpinned] = await commands.unpin([ENTITY])
    assert not unpinned.after.pinned and unpinned.after.generation == 0
    [again] = await commands.unpin([ENTITY])
    assert not again.changed


async def test_a_named_entity_without_a_record_is_refused_unless_forced() -> None:
    store = InMemoryRoleStore()
    await store.create(ENTITY, RoleRecord(active="primary"))
    commands = RoleCommands(store, app="shop")

    for command in (
        commands.failover("secondary", ["order-event"]),
        commands.failback(["order-event", ENTITY]),
        commands.pin("secondary", ["order-event"]),
    ):
        with pytest.raises(ConfigurationError) as refused:
            await command
        text = str(refused.value)
        assert "no process of application 'shop' has shared roles for 'order-event'" in text
        assert "(entities with a record: orders)" in text and "--force" in text
        assert text.endswith("nothing changed")
    with pytest.raises(ConfigurationError, match=r"'order-event'.*check the name and --app;"):
        await commands.unpin(["order-event"])
    assert await store.entities() == [ENTITY]
    assert store.records[ENTITY] == RoleRecord(active="primary")

    [created] = await commands.failover("secondary", ["order-event"], force=True)
    assert created.changed and created.before is None and created.after.active == "secondary"

    forgotten = await commands.forget(["order-event", "never-was"])
    assert forgotten == {"order-event": created.after, "never-was": None}
    assert await store.entities() == [ENTITY]
    with pytest.raises(ConfigurationError, match="--entity"):
        await commands.forget([])


async def test_an_active_mode_entity_has_no_role_to_move() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    active = GeoSender(
        InMemoryRegionSender("primary", NAMES["primary"], ENTITY),
        InMemoryRegionSender("secondary", NAMES["secondary"], ENTITY),
        mode="active",
        role_store=store,
        clock=clock,
    )
    passive = GeoSender(
        InMemoryRegionSender("primary", NAMES["primary"], "refunds"),
        InMemoryRegionSender("secondary", NAMES["secondary"], "refunds"),
        role_store=store,
        clock=clock,
    )
    commands = RoleCommands(store, app="shop")
    async with active, passive:
        assert store.records[ENTITY].mode == "active"
        assert store.records["refunds"].mode == "passive"
        for command in (
            commands.failover("secondary", [ENTITY]),
            commands.failback([ENTITY]),
            commands.pin("secondary", [ENTITY, "refunds"]),
            commands.unpin([ENTITY]),
        ):
            with pytest.raises(ConfigurationError) as refused:
                await command
            text = str(refused.value)
            assert text.startswith("orders: its senders run in active mode: every message ")
            assert "nothing changed" in text and "passive mode" in text
        assert store.records[ENTITY].generation == 0
        assert store.records["refunds"].generation == 0 and not store.records["refunds"].pinned

        # Without --entity: the passive entity moves, the active one is skipped, said why.
        skipped, moved = await commands.failover("secondary")
        assert (skipped.entity, skipped.changed) == (ENTITY, False)
        assert "active mode" in skipped.skipped
        assert (moved.entity, moved.changed, moved.after.active) == ("refunds", True, "secondary")
        await clock.advance(0.25)
        result = await active.send_messages(FakeMessage(b"x"))
        assert result.accepted == ("primary", "secondary")
        assert passive.active_region == "secondary"

    await store.delete("refunds")
    with pytest.raises(ConfigurationError, match="every entity of application 'shop'"):
        await commands.failover("secondary")


async def test_a_sender_whose_mode_differs_from_the_record_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    await store.create(ENTITY, RoleRecord(active="primary", mode="active"))
    caplog.set_level(logging.WARNING, "georep.roles")
    async with GeoSender(
        InMemoryRegionSender("primary", NAMES["primary"], ENTITY),
        InMemoryRegionSender("secondary", NAMES["secondary"], ENTITY),
        role_store=store,
        clock=clock,
    ):
        await clock.advance(1.0)  # four more reads of the record
    lines = [r.getMessage() for r in caplog.records if "mode" in r.getMessage()]
    assert len(lines) == 1
    assert "says its senders run in active mode, this process runs in passive mode" in lines[0]
    assert "georep forget --entity orders" in lines[0]


async def test_an_unreachable_store_falls_back_to_local_roles_says_so_once_and_rejoins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = InMemoryRoleStore(refresh_interval=0.25), FakeClock()
    [process] = await fleet(1, store, clock)
    assert process.sender.roles.shared is True
    caplog.set_level(logging.WARNING, "georep.roles")

    store.unavailable = True
    await clock.advance(1.0)  # four refreshes fail
    process.primary.fail_with(ErrorKind.CONNECTION)
    result = await process.sender.send_messages(FakeMessage(b"x"))

    assert result.accepted == ("secondary",) and process.active == "secondary"  # local swap
    assert process.sender.roles.shared is False and process.link.fallbacks == 1
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1

    store.unavailable = False
    await clock.advance(0.25)

    assert process.sender.roles.shared is True and process.link.rejoins == 1
    assert process.active == "primary"  # the shared record: nobody swapped it
    assert store.records[ENTITY].generation == 0


async def test_a_store_that_never_answers_is_bounded_by_its_operation_timeout() -> None:
    clock = FakeClock()
    store = InMemoryRoleStore(operation_timeout=0.5)
    [process] = await fleet(1, store, clock)
    hang = asyncio.Event()

    async def never(*args: object, **kwargs: object) -> object:
        await hang.wait()
        raise AssertionError("unreachable")

    store.change = never  # type: ignore[method-assign]
    process.primary.fail_with(ErrorKind.CONNECTION)
    send = asyncio.create_task(process.sender.send_messages(FakeMessage(b"x")))
    await settle()
    await clock.advance(0.5)
    result = await asyncio.wait_for(send, 1)

    assert result.accepted == ("secondary",)
    assert process.sender.roles.shared is False and process.active == "secondary"


# ----------------------------------------------------------------------- corroboration
# Issue 31: one misconfigured process must not fail the whole fleet over.


async def misconfigured(store: InMemoryRoleStore, clock: FakeClock, **kwargs: object) -> Process:
    """A process whose primary never answers (a wrong port in its connection string)."""
    process = Process(store, clock, **kwargs)
    process.primary.fail_with(ErrorKind.CONNECTION)
    await process.start()
    return process


async def test_a_process_that_never_reached_the_region_moves_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = InMemoryRoleStore(refresh_interval=0.25), FakeClock()
    healthy = await fleet(7, store, clock)
    reader = InMemoryMetricReader()
    wrong = await misconfigured(store, clock, meter_provider=MeterProvider(metric_readers=[reader]))
    caplog.set_level(logging.WARNING, "georep.roles")

    result = await wrong.sender.send_messages(FakeMessage(b"x"))
    await clock.advance(1.0)  # four refreshes: the store's word does not undo it

    assert result.accepted == ("secondary",) and result.failed_over
    assert store.records[ENTITY].generation == 0 and store.records[ENTITY].active == "primary"
    assert {p.active for p in healthy} == {"primary"}
    roles = wrong.sender.roles
    assert wrong.active == "secondary" and roles.departures == 1 and roles.swaps == 0
    assert roles.departed_from is not None and roles.departed_from.active == NAMES["primary"]
    assert wrong.sender.stats.role_swaps == 0
    assert metric_points(reader)["georep.roles.departed"] == [({"georep.entity": ENTITY}, 1)]
    [line] = [r.getMessage() for r in caplog.records if "this process only" in r.getMessage()]
    assert "never reached primary" in line and "stay on primary" in line
    attempts = wrong.primary.attempts
    assert (await wrong.sender.send_messages(FakeMessage(b"y"))).accepted == ("secondary",)
    assert wrong.primary.attempts == attempts  # its own sends go straight to the backup

    # A real outage: a process that did reach the primary moves everyone, in one step.
    for process in healthy:
        process.primary.fail_with(ErrorKind.CONNECTION)
    await healthy[3].sender.send_messages(FakeMessage(b"z"))
    await clock.advance(0.25)

    assert store.records[ENTITY].generation == 1 and store.records[ENTITY].active == "secondary"
    assert {p.active for p in [*healthy, wrong]} == {"secondary"}
    assert wrong.sender.roles.departed_from is None  # the shared record moved: it follows it
    assert metric_points(reader)["georep.roles.departed"] == [({"georep.entity": ENTITY}, 0)]
    assert wrong.sender.roles.current.generation == 1
    assert sum(p.sender.roles.swaps for p in [*healthy, wrong]) == 1


async def test_without_corroboration_any_process_moves_everyone() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(corroboration=Corroboration(reached=False))
    [other] = await fleet(1, store, clock, policy=policy)
    wrong = await misconfigured(store, clock, policy=policy)

    await wrong.sender.send_messages(FakeMessage(b"x"))
    await clock.advance(0.25)

    assert store.records[ENTITY].generation == 1
    assert other.active == "secondary" and wrong.sender.roles.departed_from is None


async def test_reached_within_asks_for_a_recent_success() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(corroboration=Corroboration(reached_within=60))
    stale, fresh = await fleet(2, store, clock, policy=policy)
    await clock.advance(120)  # both reached the primary on open, two minutes ago
    await fresh.sender.send_messages(FakeMessage(b"ok"))  # one of them just now
    stale.primary.fail_with(ErrorKind.CONNECTION)
    fresh.primary.fail_with(ErrorKind.CONNECTION)

    await stale.sender.send_messages(FakeMessage(b"x"))
    assert store.records[ENTITY].generation == 0 and stale.sender.roles.departures == 1

    await fresh.sender.send_messages(FakeMessage(b"y"))
    await clock.advance(0.25)
    assert store.records[ENTITY].generation == 1
    assert stale.active == fresh.active == "secondary"
    assert stale.sender.roles.departed_from is None


async def test_reports_from_enough_processes_within_the_window_move_everyone() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(corroboration=Corroboration(reports=2, window=30))
    first, second, third = await fleet(3, store, clock, policy=policy)
    wrong = await misconfigured(store, clock, policy=policy)
    for process in (first, second, third):
        process.primary.fail_with(ErrorKind.CONNECTION)

    await wrong.sender.send_messages(FakeMessage(b"w"))  # never reached it: no report
    await first.sender.send_messages(FakeMessage(b"a"))  # one report of the two asked for
    assert store.records[ENTITY].generation == 0
    assert first.active == "secondary" and first.sender.roles.departures == 1
    assert [len(r) for r in store.reports.values()] == [1]

    await clock.advance(31)  # the first report is too old to count
    await second.sender.send_messages(FakeMessage(b"b"))
    assert store.records[ENTITY].generation == 0 and second.sender.roles.departures == 1

    await clock.advance(5)
    await third.sender.send_messages(FakeMessage(b"c"))  # within 30 s of the second's
    await clock.advance(0.25)
    assert store.records[ENTITY].generation == 1 and third.sender.roles.swaps == 1
    assert {p.active for p in (first, second, third, wrong)} == {"secondary"}
    assert all(p.sender.roles.departed_from is None for p in (first, second, third, wrong))


async def test_a_process_on_its_own_roles_returns_when_the_region_it_left_answers() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    policy = FailoverPolicy(
        corroboration=Corroboration(reports=2),
        switch_back_probe_interval=5,
        failback_after=20,
    )  # switch_back stays off: that is about moving every process back
    lonely, other = await fleet(2, store, clock, policy=policy)
    lonely.primary.fail_with(ErrorKind.CONNECTION)  # a blip only it sees
    await lonely.sender.send_messages(FakeMessage(b"x"))
    assert lonely.active == "secondary" and other.active == "primary"

    await clock.advance(30)  # still failing: it stays on its own roles
    assert lonely.active == "secondary"
    lonely.primary.restore()
    await clock.advance(20)  # the primary answered, but not for 20 s yet
    assert lonely.active == "secondary"
    await clock.advance(10)

    assert lonely.active == "primary" and lonely.sender.roles.departed_from is None
    assert store.records[ENTITY].generation == 0
    assert lonely.sender.stats.role_swaps == 0


async def test_reports_need_a_store_that_keeps_them() -> None:
    class RecordsOnly:
        read = create = change = entities = aclose = InMemoryRoleStore.read

    primary = InMemoryRegionSender("primary", NAMES["primary"], ENTITY)
    secondary = InMemoryRegionSender("secondary", NAMES["secondary"], ENTITY)
    policy = FailoverPolicy(corroboration=Corroboration(reports=3))
    with pytest.raises(ConfigurationError, match=r"reports=3.*report_failure"):
        GeoSender(primary, secondary, role_store=RecordsOnly(), policy=policy)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- relay


async def test_relay_channels_in_two_processes_share_one_swap() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    labels = {"primary": "primary", "secondary": "secondary"}
    channels = []
    for _ in range(2):
        link = SharedRoles(store, "orders-api", RoleState("primary"), names=labels, clock=clock)
        await link.refresh()
        link.hold()
        endpoints = (InMemoryRelayEndpoint("primary"), InMemoryRelayEndpoint("secondary"))
        channel = FailoverChannel(endpoints, role_state=link.state, clock=clock)
        channels.append((channel, endpoints, link))
    (first, (first_primary, _), _), (second, (second_primary, _), _) = channels
    first_primary.fail_with(ErrorKind.CONNECTION)

    response = await first.request("GET", "/health")
    await clock.advance(0.25)

    assert response.region == "secondary"
    assert store.records["orders-api"].generation == 1
    assert first.active == second.active == "secondary"
    await second.request("GET", "/health")
    assert second_primary.attempts == 0
    for channel, _, link in channels:
        await link.release()
        await channel.aclose()


async def test_a_relay_channel_with_a_role_store_follows_the_operator() -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    endpoints = (InMemoryRelayEndpoint("primary"), InMemoryRelayEndpoint("secondary"))
    with pytest.raises(ConfigurationError, match="role_entity"):
        FailoverChannel(endpoints, role_store=store)
    async with FailoverChannel(
        endpoints, role_store=store, role_entity="orders-api", clock=clock
    ) as channel:
        first = channel.active
        other = "secondary" if first == "primary" else "primary"
        assert store.records["orders-api"].active == first

        await RoleCommands(store, app="test").failover(other)
        await clock.advance(0.25)

        assert channel.active == other
        assert (await channel.request("GET", "/x")).region == other


# ------------------------------------------------------------------------------ paired


def paired_process(
    store: InMemoryRoleStore, clock: FakeClock, name: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[PairedSender, InMemoryRegionSender]:
    """A PairedSender as another process would have it: its own shared-roles link."""
    monkeypatch.setattr(role_store_module, "_links", weakref.WeakValueDictionary())
    primary = InMemoryRegionSender("primary", f"east-{name}", ENTITY)
    backlog = [InMemoryRegionSender("backlog-0", "west", "east/x-servicebus-transfer/0")]
    sender = PairedSender(
        primary,
        backlog,
        rewrite=lambda message, destination, **_: message,
        make_ping=lambda: FakeMessage(b""),
        options=PairedNamespaceOptions(
            backlog_queue_count=1, failover_interval=0, ping_primary_interval=5
        ),
        clock=clock,
        role_store=store,
    )
    return sender, primary


async def test_paired_senders_engage_and_disengage_together_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    first, first_primary = paired_process(store, clock, "a", monkeypatch)
    second, second_primary = paired_process(store, clock, "b", monkeypatch)
    await first.__aenter__()
    await second.__aenter__()
    first_primary.fail_with(ErrorKind.CONNECTION)
    second_primary.fail_with(ErrorKind.CONNECTION)

    assert (await first.send_messages(FakeMessage(b"1"))).startswith("east/")
    await clock.advance(0.25)

    assert store.records[ENTITY].generation == 1 and second.state.engaged
    assert (await second.send_messages(FakeMessage(b"2"))).startswith("east/")
    assert second_primary.attempts == 0

    first_primary.restore()
    second_primary.restore()
    await clock.advance(5)  # both ping and succeed: one disengages the roles for both
    await clock.advance(0.25)

    assert store.records[ENTITY].generation == 2
    assert not first.state.engaged and not second.state.engaged
    assert await second.send_messages(FakeMessage(b"3")) == "primary"
    await first.aclose()
    await second.aclose()


async def test_paired_senders_follow_an_operator_and_do_not_ping_it_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, clock = InMemoryRoleStore(), FakeClock()
    sender, _ = paired_process(store, clock, "a", monkeypatch)
    async with sender:
        await RoleCommands(store, app="test").failover("secondary")
        await clock.advance(0.25)
        assert sender.state.engaged
        await clock.advance(20)  # the primary is fine, but an operator engaged failover
        assert sender.state.engaged and sender.pings == 0

        await RoleCommands(store, app="test").failback()
        await clock.advance(0.25)
        assert not sender.state.engaged
        assert await sender.send_messages(FakeMessage(b"x")) == "primary"


async def test_each_operator_change_is_logged_with_who_and_when_and_traced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = InMemoryRoleStore()
    await store.create(ENTITY, RoleRecord(active="primary"))
    caplog.set_level(logging.WARNING, "georep.roles")

    await RoleCommands(store, app="shop", tracer_provider=provider).failover("secondary")

    [span] = exporter.get_finished_spans()
    assert span.name == "georep failover"
    attributes = dict(span.attributes or {})
    assert attributes["georep.app"] == "shop" and attributes["georep.entity"] == ENTITY
    assert attributes["georep.region"] == "secondary" and attributes["georep.generation"] == 1
    assert f"pid {os.getpid()} (georep failover)" in str(attributes["enduser.id"])
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("failover orders: secondary active, generation 1, by ")
    assert re.search(r"@.+ pid \d+ \(georep failover\) at \d{4}-\d\d-\d\dT", line)


# ------------------------------------------------------------ the background refresh


async def test_the_refresh_survives_a_store_that_raises_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error refresh() does not take for an unreachable store ended the poller
    silently: the process then never followed the store again."""
    store, clock = InMemoryRoleStore(refresh_interval=0.25), FakeClock()
    [process] = await fleet(1, store, clock)
    read = store.read

    async def garbled(entity: str) -> RoleRecord | None:
        raise ValueError("the record does not parse")

    store.read = garbled  # type: ignore[method-assign]
    await clock.advance(0.5)
    assert "reading the shared roles of orders failed" in caplog.text
    store.read = read  # type: ignore[method-assign]
    store.records[ENTITY] = RoleRecord(active="secondary", generation=3)
    await clock.advance(0.25)
    assert process.active == "secondary", "the refresh went on after the error"
    await process.stop()


async def test_release_is_bounded_when_a_store_call_swallows_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The last release awaited its poller without a bound: a store call that swallows
    cancellation (and the deadline's with it) hung the owner's aclose for ever."""
    clock = FakeClock()
    store = InMemoryRoleStore(refresh_interval=0.25, operation_timeout=0.5)
    [process] = await fleet(1, store, clock)
    let_go = asyncio.Event()

    async def stubborn(entity: str) -> RoleRecord | None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                continue
        return None

    store.read = stubborn  # type: ignore[method-assign]
    await clock.advance(0.25)  # the next refresh is stuck in the store call
    releasing = asyncio.create_task(process.link.release())
    await clock.advance(STOP_TIMEOUT)
    assert releasing.done()
    assert "georep-roles orders did not end within" in caplog.text
    let_go.set()
    await settle()
    await process.sender.aclose()
