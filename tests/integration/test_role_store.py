"""The RoleStore contract, run against the in-memory store and Redis; and what a process
does when Redis goes away and comes back (through a proxy the test cuts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from _helpers import LOADED, REDIS_URL, eventually

from georep import ErrorKind, GeoSender, StoreUnavailableError
from georep.adapters.redis import RedisRoleStore
from georep.ports import RoleChangeTerms, RoleRecord, RoleStore
from georep.testing import FakeMessage, InMemoryRegionSender, InMemoryRoleStore


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RoleStore]:
    if request.param == "memory":
        yield InMemoryRoleStore()
        return
    async with RedisRoleStore.from_url(
        REDIS_URL, app=f"test-{uuid.uuid4().hex[:8]}", operation_timeout=LOADED
    ) as redis:
        yield redis


def first(active: str = "primary") -> RoleRecord:
    return RoleRecord(active=active, generation=0, since=100.0, changed_by="test")


async def test_create_keeps_the_first_record(store: RoleStore) -> None:
    assert await store.read("orders") is None
    assert await store.create("orders", first()) == first()
    assert await store.create("orders", first("secondary")) == first()
    assert await store.read("orders") == first()
    await store.create("refunds", first())
    assert await store.entities() == ["orders", "refunds"]


async def test_change_is_a_compare_and_set_on_the_generation(store: RoleStore) -> None:
    await store.create("orders", first())

    stale = await store.change(
        "orders",
        RoleChangeTerms(expected_generation=3, active="secondary", changed_by="late", now=200.0),
    )
    swapped, record = await store.change(
        "orders",
        RoleChangeTerms(expected_generation=0, active="secondary", changed_by="me", now=200.0),
    )

    assert stale == (False, first())
    assert swapped
    assert record == RoleRecord("secondary", 1, 200.0, False, True, "me")
    assert await store.read("orders") == record


async def test_racing_changes_make_one_generation_step(store: RoleStore) -> None:
    await store.create("orders", first())

    outcomes = await asyncio.gather(
        *(
            store.change(
                "orders",
                RoleChangeTerms(
                    expected_generation=0, active="secondary", changed_by=f"p{i}", now=1.0
                ),
            )
            for i in range(20)
        )
    )

    assert sum(swapped for swapped, _ in outcomes) == 1
    record = await store.read("orders")
    assert record is not None and record.generation == 1


async def test_a_pin_refuses_automatic_changes_and_moves_no_generation(store: RoleStore) -> None:
    await store.create("orders", first())
    pinned, record = await store.change(
        "orders",
        RoleChangeTerms(0, "primary", "op", 5.0, automatic=False, pinned=True),
    )
    assert pinned and record.pinned and record.generation == 0 and record.since == 100.0

    refused = await store.change(
        "orders",
        RoleChangeTerms(expected_generation=0, active="secondary", changed_by="auto", now=6.0),
    )
    by_operator = await store.change(
        "orders",
        RoleChangeTerms(
            expected_generation=0, active="secondary", changed_by="op", now=7.0, automatic=False
        ),
    )

    assert refused == (False, record)
    assert by_operator[0] and by_operator[1] == RoleRecord("secondary", 1, 7.0, True, False, "op")


async def test_a_change_of_a_missing_record_is_refused(store: RoleStore) -> None:
    swapped, _ = await store.change(
        "nothing",
        RoleChangeTerms(expected_generation=0, active="secondary", changed_by="x", now=1.0),
    )
    assert not swapped and await store.read("nothing") is None


async def test_delete_removes_the_record_and_its_entity(store: RoleStore) -> None:
    await store.create("orders", first())
    await store.create("order-event", first("secondary"))

    assert await store.delete("order-event") is True
    assert await store.delete("order-event") is False
    assert await store.read("order-event") is None
    assert await store.entities() == ["orders"]
    # A process still sharing the entity creates it again, as the first one did.
    assert await store.create("order-event", first()) == first()
    assert await store.entities() == ["order-event", "orders"]


async def test_the_mode_is_kept_from_the_creation_through_changes(store: RoleStore) -> None:
    active = RoleRecord(active="primary", since=1.0, changed_by="sender", mode="active")
    assert await store.create("orders", active) == active
    swapped, record = await store.change(
        "orders",
        RoleChangeTerms(0, "secondary", "op", 2.0, automatic=False, pinned=True),
    )
    assert swapped and record.mode == "active"
    assert await store.read("orders") == record
    refused = await store.change(
        "orders",
        RoleChangeTerms(expected_generation=0, active="primary", changed_by="late", now=3.0),
    )
    assert refused == (False, record)


async def test_a_redis_record_written_before_the_mode_was_kept_reads_as_unknown() -> None:
    async with RedisRoleStore.from_url(
        REDIS_URL, app=f"test-{uuid.uuid4().hex[:8]}", operation_timeout=LOADED
    ) as redis:
        # The hash an earlier georep wrote: six fields, no 'mode'.
        await redis.client.hset(
            redis.key("orders"),
            mapping={
                "active": "secondary",
                "generation": "2",
                "since": "5.0",
                "pinned": "0",
                "automatic": "1",
                "changed_by": "old",
            },
        )
        record = await redis.read("orders")
        assert record == RoleRecord("secondary", 2, 5.0, False, True, "old", mode="")
        swapped, changed = await redis.change(
            "orders",
            RoleChangeTerms(expected_generation=2, active="primary", changed_by="new", now=6.0),
        )
        assert swapped and changed.mode == "" and changed.generation == 3
        await redis.client.delete(redis.key("orders"))


async def test_failure_reports_count_distinct_processes_within_the_window(
    store: RoleStore,
) -> None:
    async def report(reporter: str, now: float, *, generation: int = 0) -> int:
        return await store.report_failure(
            "orders",
            region="primary",
            generation=generation,
            reporter=reporter,
            now=now,
            window=30.0,
        )

    assert await report("a", 1000.0) == 1
    assert await report("a", 1001.0) == 1  # the same process twice is one report
    assert await report("b", 1002.0) == 2
    assert await report("c", 1000.5, generation=1) == 1  # another generation: counted apart
    assert await report("c", 1031.5) == 2  # a's last report (1001) is over 30 s old
    assert await report("d", 1100.0) == 1


async def test_an_unreachable_redis_raises_store_unavailable_in_bounded_time() -> None:
    async with RedisRoleStore.from_url(
        "redis://127.0.0.1:1/0", app="nowhere", operation_timeout=0.3
    ) as redis:
        with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1:1 cannot be reached"):
            await asyncio.wait_for(redis.read("orders"), 2)


class CuttableProxy:
    """A TCP proxy to Redis that the test can cut (every connection dropped, new ones
    refused) and restore on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


async def test_a_process_falls_back_to_its_own_roles_while_redis_is_away_and_rejoins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parts = urlsplit(REDIS_URL)
    proxy = CuttableProxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    await proxy.start()
    url = f"redis://127.0.0.1:{proxy.port}{parts.path}"
    primary = InMemoryRegionSender("primary", "east.example", "orders")
    secondary = InMemoryRegionSender("secondary", "west.example", "orders")
    caplog.set_level(logging.WARNING, "georep.roles")
    async with (
        RedisRoleStore.from_url(
            url, app=f"test-{uuid.uuid4().hex[:8]}", refresh_interval=0.1, operation_timeout=0.3
        ) as store,
        GeoSender(primary, secondary, role_store=store) as sender,
    ):
        assert sender.roles.shared is True
        await proxy.cut()
        assert await eventually(lambda: sender.roles.shared is False, within=3)

        primary.fail_with(ErrorKind.CONNECTION)
        result = await sender.send_messages(FakeMessage(b"x"))
        assert result.accepted == ("secondary",) and sender.active_region == "secondary"
        await asyncio.sleep(0.5)  # more refreshes fail: still said only once
        assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1

        await proxy.start()  # Redis is back, on the same address
        assert await eventually(lambda: sender.roles.shared is True, within=3)
        # The shared record is the truth again: no process swapped it.
        assert sender.active_region == "primary"
        assert len([r for r in caplog.records if "answers again" in r.getMessage()]) == 1
    await proxy.cut()
