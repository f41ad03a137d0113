"""The whole surface through one primary outage, audited from the ledgers (issue 14).

Entity {queue, topic with two subscriptions, partitioned queue} x mode {active, passive,
paired} x client {async, sync}: 18 cells. Every cell sends at a steady rate while the
primary namespace goes down and comes back, GeoReceivers (one per queue or subscription,
all on one Redis group with default options) process what arrives, and each queue or
subscription is audited from its ledger: nothing lost, nothing processed twice.

The cells run at the same time against one private emulator, so one outage is mid-run for
all of them and the wall time is that of one cell. Async cells use the async SDK and
georep's async API. Sync cells are sync applications: they send with sync SDK senders
wrapped by ``georep.sync.GeoSender`` (paired: ``georep.sync.PairedSender``) and receive
with ``georep.sync.GeoReceiver.run`` on threads, half of the receivers wrapping the
application's sync SDK receivers and half built with ``from_connection_strings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import PACE, REDIS_URL, backlog_queues
from azure.servicebus import ServiceBusClient as SyncClient, ServiceBusMessage

import georep.sync
from georep import (
    FailoverPolicy,
    GeoReceiver,
    GeoReplicationError,
    GeoSender,
    PairedNamespaceOptions,
    PairedSender,
    ParquetLedger,
    ReplicationMode,
    Syphon,
)
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.spark import reference_audit

pytestmark = [
    pytest.mark.integration,
    pytest.mark.heavy,
    # Partitioned cells use a 3 s attempt deadline to keep the run short.
    pytest.mark.filterwarnings("ignore:attempt_timeout=.*partitioned entity:UserWarning"),
]

MESSAGES = int(os.environ.get("GEOREP_MATRIX_MESSAGES", "120"))
SEND_SECONDS = 5.0
OUTAGE_AT, OUTAGE_FOR = 1.5, 3.0
#: A copy in flight when the outage drops its connection stays locked this long (as on
#: Service Bus) before it is redelivered: short, so the run catches up quickly.
LOCK_SECONDS = 5
#: When the outage began and ended (monotonic seconds), for failure messages.
OUTAGE: dict[str, float] = {}
#: Set when the cells did not all catch up: the messages each region still stored, per
#: entity not caught up and per backlog queue (late, if any; lost, if none).
LEFT: dict[str, int] = {}
SUBSCRIPTIONS = ("billing", "shipping")
ENTITIES = ("queue", "topic", "partitioned")
MODES = ("active", "passive", "paired")
CLIENTS = ("async", "sync")
# Stretched on a slower machine: there, a loaded secondary did not answer a passive cell's
# failover within 3 s, so the cell failed both regions instead of failing over.
POLICY = FailoverPolicy(attempt_timeout=3.0 * PACE)
PAIRED = PairedNamespaceOptions(
    backlog_queue_count=2,
    failover_interval=0,
    ping_primary_interval=1,
    # Each primary (and backlog) send's deadline. Shorter than the outage, which lasts until
    # every cell has had sends acknowledged inside it, so a send that the outage leaves
    # hanging still fails over inside it; long enough for a backlog queue's first link on
    # a loaded machine (2 s was not, with 12 test workers on 2 cores).
    ping_timeout=5,
    syphon_long_poll=1,
)


@dataclass
class Cell:
    entity: str
    mode: str
    client: str
    directory: Path
    acknowledged: set[str] = field(default_factory=set)
    processed: dict[str, Counter[str]] = field(default_factory=dict)
    send_errors: list[str] = field(default_factory=list)
    receivers: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.entity}-{self.mode}-{self.client}"

    @property
    def name(self) -> str:
        return f"mx-{self.id}"

    @property
    def is_topic(self) -> bool:
        return self.entity == "topic"

    @property
    def paths(self) -> list[str]:
        """What receivers read: the queue, or each subscription."""
        if self.is_topic:
            return [f"{self.name}/Subscriptions/{s}" for s in SUBSCRIPTIONS]
        return [self.name]

    def ledger_dir(self, role: str) -> Path:
        return self.directory / self.id / role

    def message(self, index: int) -> ServiceBusMessage:
        message = ServiceBusMessage(f"{self.id}-{index}", message_id=f"{self.id}-{index}")
        if self.entity == "partitioned" and index % 3 == 0:
            message.partition_key = f"pk-{index % 4}"
        return message


CELLS = [Cell(e, m, c, Path()) for e in ENTITIES for m in MODES for c in CLIENTS]


def entity_kwargs(cell: Cell) -> dict[str, str]:
    return {"topic_name": cell.name} if cell.is_topic else {"queue_name": cell.name}


def receiver_kwargs(path: str) -> dict[str, str]:
    if "/Subscriptions/" in path:
        topic, _, subscription = path.partition("/Subscriptions/")
        return {"topic_name": topic, "subscription_name": subscription}
    return {"queue_name": path}


# ---------------------------------------------------------------------------- senders


class Pacer:
    """Send ``MESSAGES`` evenly over ``SEND_SECONDS`` from a shared start.

    Every sender opens its connections first and then waits at the barrier; the start is
    set when all of them (and the outage) are there, so the outage is mid-run for every
    cell however long opening 18 senders takes.
    """

    def __init__(self, parties: int) -> None:
        self.start = 0.0
        self.barrier = threading.Barrier(parties, action=self._go, timeout=120)

    def _go(self) -> None:
        self.start = time.monotonic() + 0.2

    def ready(self) -> None:
        """Block until every party is ready (call from a thread)."""
        self.barrier.wait()

    def due(self, index: int) -> float:
        return self.start + SEND_SECONDS * index / MESSAGES - time.monotonic()


def paired_sender(cls: Any, cell: Cell, emu: Emulator, ledger: Any) -> Any:
    """The cell's PairedSender (``cls``: the async or the sync one) on the emulator."""
    return cls.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        primary_namespace=primary_name(emu),
        options=PAIRED,
        ledger=ledger,
        **entity_kwargs(cell),
    )


async def send_async(cell: Cell, emu: Emulator, pacer: Pacer) -> None:
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    ledger = ParquetLedger(cell.ledger_dir("send"))
    sender: Any
    if cell.mode == "paired":
        sender = paired_sender(PairedSender, cell, emu, ledger)
    else:
        sender = GeoSender.from_connection_strings(
            primary,
            secondary,
            mode=ReplicationMode(cell.mode),
            policy=POLICY,
            partitioned=cell.entity == "partitioned",
            ledger=ledger,
            **entity_kwargs(cell),
        )
    async with ledger, sender:
        await asyncio.to_thread(pacer.ready)
        for index in range(MESSAGES):
            await asyncio.sleep(max(pacer.due(index), 0))
            message = cell.message(index)
            for attempt in range(20):
                try:
                    await sender.send_messages(message)
                except GeoReplicationError as exc:
                    # Paired mode raises while failover engages (as the .NET original):
                    # the application retries with the same MessageId.
                    cell.send_errors.append(f"{time.monotonic():.1f} {exc!r}"[:300])
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                cell.acknowledged.add(str(message.message_id))
                break


def send_sync(cell: Cell, emu: Emulator, pacer: Pacer) -> None:
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    # georep.sync closes the async resources it is given (the ledger) with the sender.
    ledger = ParquetLedger(cell.ledger_dir("send"))
    with contextlib.ExitStack() as stack:
        sender: Any
        if cell.mode == "paired":
            sender = paired_sender(georep.sync.PairedSender, cell, emu, ledger)
        else:
            clients = [
                # Short SDK retries, as georep's own clients have: each retry delays failover.
                stack.enter_context(
                    SyncClient.from_connection_string(c, retry_total=1, retry_backoff_factor=0.01)
                )
                for c in (primary, secondary)
            ]
            sdk_senders = [
                stack.enter_context(
                    client.get_topic_sender(cell.name)
                    if cell.is_topic
                    else client.get_queue_sender(cell.name)
                )
                for client in clients
            ]
            sender = georep.sync.GeoSender(
                sdk_senders[0],
                sdk_senders[1],
                mode=cell.mode,
                policy=POLICY,
                partitioned=cell.entity == "partitioned",
                ledger=ledger,
            )
        stack.enter_context(sender)  # opens both regions' links, as async with does
        pacer.ready()
        for index in range(MESSAGES):
            time.sleep(max(pacer.due(index), 0))
            message = cell.message(index)
            for attempt in range(20):
                try:
                    sender.send_messages(message)
                except GeoReplicationError as exc:
                    cell.send_errors.append(f"{time.monotonic():.1f} {exc!r}"[:300])
                    time.sleep(0.1 * (attempt + 1))
                    continue
                cell.acknowledged.add(str(message.message_id))
                break


#: The primary namespace's name for the backlog queues: this run's own (the emulator may
#: have served another module's paired senders, whose backlog queues the syphon would read).
_PRIMARY_NAME = f"matrix{uuid.uuid4().hex[:8]}"


def primary_name(emu: Emulator) -> str:
    return _PRIMARY_NAME


# -------------------------------------------------------------------------- receivers


def counting(cell: Cell, path: str) -> Callable[[Any], None]:
    counter = cell.processed.setdefault(path, Counter())
    lock = threading.Lock()

    def count(message: Any) -> None:
        with lock:
            counter[str(message.message_id)] += 1

    return count


class Receivers:
    """Every cell's receivers, one GeoReceiver per queue or subscription.

    Async cells: async GeoReceivers on this loop. Sync cells: ``georep.sync.GeoReceiver``
    ``run()`` on a thread each, half of them wrapping the application's sync SDK
    receivers and half built with ``from_connection_strings`` (see :func:`sync_style`).
    """

    def __init__(self, emu: Emulator, group: str) -> None:
        self.emu = emu
        self.group = group
        self.tasks: list[asyncio.Task[None]] = []
        self.async_receivers: list[GeoReceiver] = []
        self.sync_receivers: list[georep.sync.GeoReceiver] = []
        self.ledgers: list[Any] = []
        self.sdk = contextlib.ExitStack()
        self._sync_clients: list[SyncClient] = []

    def seen(self) -> RedisSeenSet:
        # The same group for every cell and subscription: dedup is scoped by entity path.
        return RedisSeenSet(REDIS_URL, group=self.group, window=600)

    async def start(self, cell: Cell) -> None:
        for index, path in enumerate(cell.paths):
            directory = cell.ledger_dir(f"receive-{index}")
            if cell.client == "async":
                cell.receivers.append("GeoReceiver")
                await self._start_async(cell, path, directory)
            else:
                cell.receivers.append(f"georep.sync.GeoReceiver/{sync_style(cell, index)}")
                # Built off the loop (it blocks), then run() blocks a thread until close().
                receiver = await asyncio.to_thread(
                    self._sync_receiver, cell, index, path, directory
                )
                self.sync_receivers.append(receiver)
                run = asyncio.to_thread(receiver.run, counting(cell, path))
                self.tasks.append(asyncio.ensure_future(run))

    async def _start_async(self, cell: Cell, path: str, directory: Path) -> None:
        ledger = ParquetLedger(directory)
        self.ledgers.append(ledger)
        receiver = GeoReceiver.from_connection_strings(
            self.emu.connection_string("primary"),
            self.emu.connection_string("secondary"),
            seen=self.seen(),
            concurrency=8,
            max_wait=0.5,
            ledger=ledger,
            **receiver_kwargs(path),
        )
        count = counting(cell, path)

        async def handle(message: Any) -> None:
            count(message)

        self.async_receivers.append(receiver)
        self.tasks.append(asyncio.create_task(receiver.run(handle)))

    def _sdk_receiver(self, region: int, path: str) -> Any:
        """A sync SDK receiver, as a sync application opens it (closed by the test)."""
        if not self._sync_clients:
            self._sync_clients = [
                # Short SDK retries, as georep's own clients have.
                self.sdk.enter_context(
                    SyncClient.from_connection_string(
                        self.emu.connection_string(r), retry_total=1, retry_backoff_factor=0.01
                    )
                )
                for r in ("primary", "secondary")
            ]
        client = self._sync_clients[region]
        kwargs = receiver_kwargs(path)
        if "topic_name" in kwargs:
            return self.sdk.enter_context(
                client.get_subscription_receiver(kwargs["topic_name"], kwargs["subscription_name"])
            )
        return self.sdk.enter_context(client.get_queue_receiver(kwargs["queue_name"]))

    def _sync_receiver(
        self, cell: Cell, index: int, path: str, directory: Path
    ) -> georep.sync.GeoReceiver:
        # georep.sync closes the async resources it is given (ledger, seen-set).
        options: dict[str, Any] = {
            "seen": self.seen(),
            "concurrency": 8,
            "max_wait": 0.5,
            "ledger": ParquetLedger(directory),
        }
        if sync_style(cell, index) == "wrap":
            return georep.sync.GeoReceiver(
                self._sdk_receiver(0, path), self._sdk_receiver(1, path), **options
            )
        return georep.sync.GeoReceiver.from_connection_strings(
            self.emu.connection_string("primary"),
            self.emu.connection_string("secondary"),
            **receiver_kwargs(path),
            **options,
        )

    async def stop(self) -> None:
        await asyncio.gather(
            *(r.aclose() for r in self.async_receivers),
            *(asyncio.to_thread(r.close) for r in self.sync_receivers),
        )
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        await asyncio.gather(*(ledger.aclose() for ledger in self.ledgers))
        await asyncio.to_thread(self.sdk.close)


def sync_style(cell: Cell, path_index: int) -> str:
    """How a sync cell's receiver is built: ``"wrap"`` (the application's sync SDK
    receivers) or ``"connection_strings"``; both styles in every entity and every mode."""
    turn = ENTITIES.index(cell.entity) + MODES.index(cell.mode) + path_index + 1
    return "wrap" if turn % 2 == 0 else "connection_strings"


# ------------------------------------------------------------------------------- run


def behind(cells: list[Cell]) -> list[str]:
    """The entities (and subscriptions) that have not processed every acknowledged send."""
    return [
        path
        for cell in cells
        for path in cell.paths
        if not cell.acknowledged <= set(cell.processed.get(path, ()))
    ]


def caught_up(cells: list[Cell]) -> bool:
    return not behind(cells)


def _left(emu: Emulator, cells: list[Cell], backlogs: list[str]) -> dict[str, int]:
    """What each region still stores of the entities :func:`behind`, and of the backlog
    queues (the secondary's)."""
    places = [(n, path) for path in behind(cells) for n in emu.namespaces]
    places += [("secondary", queue) for queue in backlogs]
    left: dict[str, int] = {}
    for namespace, path in places:
        with contextlib.suppress(Exception):
            left[f"{namespace}:{path}"] = emu.namespace(namespace).message_count(path)
    return left


async def run_matrix(emu: Emulator, cells: list[Cell]) -> dict[str, float]:
    """Run every cell through one outage; return timings for the report."""
    # Sync cells and barrier waits each hold a thread for the whole run: the default
    # executor (cores + 4 threads) would deadlock at the barrier.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=64))
    _, backlogs = await backlog_queues(emu, PAIRED, primary_name(emu))
    syphon = Syphon.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        primary_namespace=primary_name(emu),
        options=PAIRED,
    )
    syphon_task = asyncio.create_task(syphon.run())
    receivers = Receivers(emu, group=f"matrix-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    try:
        for cell in cells:
            await receivers.start(cell)
        pacer = Pacer(len(cells) + 1)

        async def outage() -> None:
            await asyncio.to_thread(pacer.ready)
            await asyncio.sleep(max(pacer.start + OUTAGE_AT - time.monotonic(), 0))
            await asyncio.to_thread(emu.namespace("primary").outage)
            OUTAGE["began"] = time.monotonic()
            before = [len(cell.acknowledged) for cell in cells]
            await asyncio.sleep(OUTAGE_FOR)
            # On a loaded machine a cell can fall behind its schedule: the outage lasts
            # until every cell has had two sends acknowledged inside it (30 s at most), so
            # that it is mid-run for each. (Sends that raised do not count: retried after
            # the outage, they would go to the primary.)
            until = time.monotonic() + 30
            while time.monotonic() < until and any(  # noqa: ASYNC110 - counters of threads
                len(cell.acknowledged) < count + 2
                for cell, count in zip(cells, before, strict=True)
            ):
                await asyncio.sleep(0.1)
            await asyncio.to_thread(emu.namespace("primary").restore)
            OUTAGE["ended"] = time.monotonic()

        sends = [
            send_async(cell, emu, pacer)
            if cell.client == "async"
            else asyncio.to_thread(send_sync, cell, emu, pacer)
            for cell in cells
        ]
        await asyncio.gather(outage(), *sends)
        sent = time.monotonic()
        # Stretched on a slower machine: there, the last few sends of the three paired sync
        # cells, syphoned from the backlog queues, had not been processed after 90 s.
        deadline = sent + 90 * PACE
        while not caught_up(cells) and time.monotonic() < deadline:  # noqa: ASYNC110 - polls counters other threads update
            await asyncio.sleep(0.5)
        caught = time.monotonic()
        if not caught_up(cells):
            LEFT.update(await asyncio.to_thread(_left, emu, cells, backlogs))
        # Late copies (the twin of an active send, a redelivery) get a moment to arrive
        # and be suppressed, so a second processing would show in the counts.
        await asyncio.sleep(3)
    finally:
        await receivers.stop()
        await syphon.aclose()
        with contextlib.suppress(asyncio.CancelledError, GeoReplicationError):
            await asyncio.wait_for(syphon_task, 10)
    total = time.monotonic() - started
    return {"send": sent - pacer.start, "catch_up": caught - sent, "total": total}


def audit(cell: Cell, index: int) -> dict[str, Any]:
    """The ledger audit of one queue or subscription: the cell's sends + its receives."""
    directory = cell.ledger_dir(f"audit-{index}")
    shutil.copytree(cell.ledger_dir("send") / "sends", directory / "sends")
    shutil.copytree(cell.ledger_dir(f"receive-{index}") / "receives", directory / "receives")
    return reference_audit(directory)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Cell]]:
    directory = tmp_path_factory.mktemp("matrix")
    cells = [Cell(c.entity, c.mode, c.client, directory) for c in CELLS]
    with Emulator() as emu:
        for namespace in emu.namespaces:
            control = emu.namespace(namespace)
            with emu.admin_client(namespace) as admin:
                for cell in cells:
                    if not cell.is_topic:
                        control.create_queue(
                            cell.name,
                            lock_duration=LOCK_SECONDS,
                            enable_partitioning=cell.entity == "partitioned",
                        )
                        continue
                    admin.create_topic(cell.name)
                    for subscription in SUBSCRIPTIONS:
                        admin.create_subscription(
                            cell.name, subscription, lock_duration=timedelta(seconds=LOCK_SECONDS)
                        )
        timings = asyncio.run(run_matrix(emu, cells))
    print(
        f"\nmatrix: {len(cells)} cells x {MESSAGES} messages: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
    )
    yield {cell.id: cell for cell in cells}


def test_sync_cells_receive_both_ways_in_every_entity_and_mode() -> None:
    styles = {"wrap", "connection_strings"}
    sync_cells = [cell for cell in CELLS if cell.client == "sync"]
    for entity in ENTITIES:
        cells = [cell for cell in sync_cells if cell.entity == entity]
        assert {sync_style(c, i) for c in cells for i, _ in enumerate(c.paths)} == styles
    for mode in MODES:
        cells = [cell for cell in sync_cells if cell.mode == mode]
        assert {sync_style(c, i) for c in cells for i, _ in enumerate(c.paths)} == styles


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cell_id", [cell.id for cell in CELLS])
def test_nothing_lost_nothing_twice(matrix: dict[str, Cell], cell_id: str) -> None:
    cell = matrix[cell_id]
    expected = "GeoReceiver" if cell.client == "async" else "georep.sync.GeoReceiver/"
    assert cell.receivers and all(r.startswith(expected) for r in cell.receivers)
    assert len(cell.acknowledged) == MESSAGES, f"send errors: {Counter(cell.send_errors)}"
    for index, path in enumerate(cell.paths):
        processed = cell.processed.get(path, Counter())
        lost = cell.acknowledged - set(processed)
        assert not lost, f"{path}: {len(lost)} lost; still stored: {LEFT}"
        assert max(processed.values()) == 1, f"{path}: processed twice"
        report = audit(cell, index)
        assert report["sent"] == MESSAGES, (path, report["sent"])
        assert report["lost"] == 0, (path, report)
        assert report["processed_more_than_once"] == 0, (path, report)
        assert report["processed"] == MESSAGES
        # The outage was mid-run for this cell: some sends went to the secondary region
        # (passive failover, active with the primary down, paired backlog queues). Paired
        # mode may instead have tried its backlog queues and been refused for the whole
        # outage (3 s; on a loaded machine the backlog queues did not answer within the 5 s
        # attempt timeout): the application retried, and the primary, back, took those
        # messages. Then its errors show the backlog queues were tried.
        tried_backlog = cell.mode == "paired" and any("backlog" in e for e in cell.send_errors)
        if not report["failover"]["sends"] and not cell.send_errors:
            # Neither a failover nor an error: the outage met none of this cell's sends
            # (seen once, partitioned-passive-sync in a fresh-clone run on a loaded machine:
            # the outage lasts until each cell had two sends acknowledged in it). One way it
            # could happen, since fixed in the emulator: a connection accepted just before
            # the outage and set up just after it dropped the others outlived it. Its claims
            # above held; what it did not test is said, not passed.
            pytest.skip(f"{path}: the outage {OUTAGE} met no send of this cell")
        assert report["failover"]["sends"] > 0 or tried_backlog, (
            path,
            report,
            OUTAGE,
            cell.send_errors,
        )
