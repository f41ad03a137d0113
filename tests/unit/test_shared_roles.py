"""Roles shared through a role store, by several "processes" (each its own RoleState and
link, as separate processes have) on the in-memory store and a fake clock."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import weakref

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from georep import (
    ConfigurationError,
    ErrorKind,
    FailoverChannel,
    FailoverPolicy,
    GeoSender,
    PairedNamespaceOptions,
    PairedSender,
    RoleState,
)
from georep import _role_store as role_store_module
from georep._lifecycle import STOP_TIMEOUT
from georep._role_commands import RoleCommands
from georep._role_store import SharedRoles
from georep.ports import RoleRecord
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

    def __init__(self, store: InMemoryRoleStore, clock: FakeClock, **kwargs: object) -> None:
        self.primary = InMemoryRegionSender("primary", NAMES["primary"], ENTITY)
        self.secondary = InMemoryRegionSender("secondary", NAMES["secondary"], ENTITY)
        self.link = SharedRoles(
            store, ENTITY, RoleState(NAMES["primary"]), names=NAMES, clock=clock
        )
        self.sender = GeoSender(
            self.primary, self.secondary, role_state=self.link.state, clock=clock, **kwargs
        )

    @property
    def active(self) -> str:
        return self.sender.active_region

    async def start(self) -> None:
        await self.link.refresh()
        self.link.hold()

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
    await others[0].sender.send_messages(FakeMessage(b"y"))
    assert others[0].primary.attempts == 0  # straight to the new active region
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
    await commands.pin("primary", [ENTITY])
    with pytest.raises(ConfigurationError, match="georep unpin"):
        await commands.failover("secondary", [ENTITY])
    [unpinned] = await commands.unpin([ENTITY])
    assert not unpinned.after.pinned and unpinned.after.generation == 0
    [again] = await commands.unpin([ENTITY])
    assert not again.changed


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
