"""GeoReceiver in session mode through the real SDK on the emulator, with a real Redis:
per-session order kept across a regional outage (docs/sessions.md)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import REDIS_URL, eventually, fault, progressing, stored
from azure.servicebus import ServiceBusMessage

import georep.sync
from georep import FailoverPolicy, GeoReceiver, GeoSender, ParquetLedger, ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.spark import audit, reference_audit
from georep.testing import InMemoryLedger

# Waits follow progress (a loaded machine is slower, not stuck): the bound is generous.
pytestmark = [pytest.mark.integration, pytest.mark.heavy, pytest.mark.timeout(300)]

SESSIONS = 50
PER_SESSION = 40


class Handled:
    """What the handler saw: per session, the message numbers in the order handled."""

    def __init__(self) -> None:
        self.by_session: dict[str, list[int]] = defaultdict(list)
        self.count = 0

    async def __call__(self, message: Any) -> None:
        session, number = str(message).split(":")
        self.by_session[session].append(int(number))
        self.count += 1

    def out_of_order(self) -> int:
        """Messages handled before a lower-numbered message of their session."""
        late = 0
        for numbers in self.by_session.values():
            highest = -1
            for number in numbers:
                if number < highest:
                    late += 1
                highest = max(highest, number)
        return late


async def send_rounds(sender: GeoSender, rounds: range) -> None:
    """One list per round: message ``round`` of every session."""
    for number in rounds:
        await sender.send_messages(
            [ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(SESSIONS)]
        )


def session_receiver(emu: Emulator, queue: str, seen: RedisSeenSet, **options: Any) -> GeoReceiver:
    options.setdefault("order_wait", 60.0)
    return GeoReceiver.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        seen=seen,
        sessions=True,
        max_sessions=16,
        max_wait=0.5,
        **options,
    )


@pytest.mark.parametrize(
    ("mode", "failure"),
    [
        (ReplicationMode.PASSIVE, "outage"),
        (ReplicationMode.PASSIVE, "blackhole"),
        (ReplicationMode.ACTIVE, "outage"),
    ],
)
async def test_fifty_sessions_keep_their_order_through_a_primary_failure(
    emu: Emulator,
    private_queue: Callable[..., str],
    seen: RedisSeenSet,
    tmp_path: Path,
    mode: ReplicationMode,
    failure: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A session held by a link a blackhole cut stays locked until its lock expires (as on
    # Azure): keep that short.
    queue = private_queue("ordered", requires_session=True, lock_duration=10)
    handled = Handled()
    total = SESSIONS * PER_SESSION
    caplog.set_level(logging.WARNING, logger="georep.receiver")
    async with ParquetLedger(tmp_path / "ledger") as ledger:
        # What is tested is that order is restored, however long the old region's tails
        # take on a loaded machine: order_wait (the outage one would rather wait out) is
        # far above any run's; giving order up after it is test_the_old_region_never_...
        receiver = session_receiver(emu, queue, seen, ledger=ledger, order_wait=600.0)
        running = asyncio.create_task(receiver.run(handled))
        try:
            async with GeoSender.from_connection_strings(
                emu.connection_string("primary"),
                emu.connection_string("secondary"),
                queue_name=queue,
                mode=mode,
                ledger=ledger,
                # A blackholed send gives up sooner than by default; 5 s leaves the
                # secondary time to open its connection on a loaded machine (2 s did not).
                policy=FailoverPolicy(attempt_timeout=5),
            ) as sender:
                await send_rounds(sender, range(PER_SESSION // 2))
                await fault(emu, "primary", failure)
                await send_rounds(sender, range(PER_SESSION // 2, PER_SESSION))
            # The new region's messages wait for the old region's tail of each session.
            await asyncio.sleep(1.0)
            await fault(emu, "primary", "restore")
            # Slower on a loaded machine, never stuck: fail when nothing was handled for
            # longer than a lost session lock takes to come back (10 s) twice over.
            assert await progressing(lambda: handled.count, total, stall=30), handled.count
            await asyncio.sleep(1.0)  # a duplicate would show up now
        finally:
            await receiver.aclose()
            await running

    assert handled.count == total
    wrong = {s: n for s, n in handled.by_session.items() if n != list(range(PER_SESSION))}
    gaps = [r.getMessage() for r in caplog.records if "without its predecessor" in r.getMessage()]
    assert not wrong, "\n".join(
        [f"{s}: {n}" for s, n in sorted(wrong.items())] + [f"{len(gaps)} gaps:", *gaps[:20]]
    )
    assert handled.out_of_order() == 0
    assert receiver.stats.order_gaps == 0, gaps[:20]
    # The ledger's audit says the same: by Spark for one case, by the reference engine
    # (the same report, test_spark_audit.py) for the others, to start Spark less often.
    if (mode, failure) == (ReplicationMode.PASSIVE, "outage"):
        report = audit(tmp_path / "ledger", master="local[2]")
    else:
        report = reference_audit(tmp_path / "ledger")
    assert (report["sent"], report["processed"], report["lost"]) == (total, total, 0)
    assert report["processed_more_than_once"] == 0
    figures = report["sessions"]
    assert (figures["sessions"], figures["messages"]) == (SESSIONS, total)
    assert figures["order_gaps"] == {}
    # The audit orders a session's copies by when their handler returned (even a copy whose
    # settlement failed afterwards and was settled from its redelivery): the same order.
    assert figures["out_of_order"] == 0, figures


async def test_the_old_region_never_returning_gives_order_up_after_order_wait(
    emu: Emulator, private_queue: Callable[..., str], seen: RedisSeenSet
) -> None:
    queue = private_queue("stranded", requires_session=True)
    sessions, half = 10, 5
    async with GeoSender.from_connection_strings(
        emu.connection_string("primary"), emu.connection_string("secondary"), queue_name=queue
    ) as sender:
        for number in range(2 * half):
            if number == half:  # the primary fails for good: each session's head is there
                await fault(emu, "primary", "outage")
            await sender.send_messages(
                [ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(sessions)]
            )
    stranded = emu.namespace("primary").message_count(queue)
    assert stranded == sessions * half

    handled = Handled()
    ledger = InMemoryLedger()
    receiver = session_receiver(emu, queue, seen, ledger=ledger, order_wait=3.0)
    running = asyncio.create_task(receiver.run(handled))
    try:
        assert await eventually(lambda: handled.count >= sessions * half, within=25)
        await asyncio.sleep(0.5)
    finally:
        await receiver.aclose()
        await running

    # Each session's tail, from the surviving region, once and in order; one visible gap each.
    assert handled.count == sessions * half
    assert all(n == list(range(half, 2 * half)) for n in handled.by_session.values())
    assert receiver.stats.order_gaps == sessions
    gaps = [r for r in ledger.receives if r.order_gap is not None]
    assert len(gaps) == sessions and all(r.order_gap == "timeout" for r in gaps)
    assert all(r.order_wait >= 3.0 for r in gaps)
    # Nothing lost: the rest is still stored in the primary, for when it comes back.
    assert emu.namespace("secondary").message_count(queue) == 0
    assert emu.namespace("primary").message_count(queue) == stranded


def test_the_sync_api_keeps_session_order_on_a_subscription_through_an_outage(
    emu: Emulator,
) -> None:
    topic, subscription = f"ordered-{uuid.uuid4().hex[:8]}", "by-customer"
    for namespace in emu.namespaces:
        with emu.admin_client(namespace) as admin:
            admin.create_topic(topic)
            admin.create_subscription(topic, subscription, requires_session=True)
    sessions, per_session = 5, 10
    names = {"topic_name": topic}
    connections = (emu.connection_string("primary"), emu.connection_string("secondary"))
    try:
        with georep.sync.GeoSender.from_connection_strings(*connections, **names) as sender:
            for number in range(per_session):
                if number == per_session // 2:
                    emu.namespace("primary").outage()
                sender.send_messages(
                    [ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(5)]
                )
        handled = Handled()
        seen = RedisSeenSet.from_url(REDIS_URL, group=f"sync-{uuid.uuid4().hex[:8]}", window=600)
        receiver = georep.sync.GeoReceiver.from_connection_strings(
            *connections,
            subscription_name=subscription,
            seen=seen,
            sessions=True,
            max_wait=0.5,
            order_wait=60.0,
            **names,
        )

        def handle(message: Any) -> None:  # a sync handler, on a worker thread
            asyncio.run(handled(message))

        runner = threading.Thread(target=receiver.run, args=(handle,))
        runner.start()
        time.sleep(2.0)  # the secondary's halves wait for the primary's
        assert handled.count == 0
        emu.namespace("primary").restore()
        deadline = time.monotonic() + 25
        while handled.count < sessions * per_session and time.monotonic() < deadline:
            time.sleep(0.1)
        receiver.close()
        runner.join(10)
    finally:
        emu.namespace("primary").restore()
    assert handled.count == sessions * per_session
    assert all(n == list(range(per_session)) for n in handled.by_session.values())
    assert receiver.stats.order_gaps == 0


def test_two_processes_compete_for_sessions_and_one_is_killed(
    emu: Emulator, private_queue: Callable[..., str], tmp_path: Path
) -> None:
    # A session the victim held stays locked until the service notices its connection is
    # gone or, at the latest, until its lock expires: keep that well inside the test's wait.
    queue = private_queue("competing", requires_session=True, lock_duration=10)
    sessions, per_session = 16, 30
    connections = (emu.connection_string("primary"), emu.connection_string("secondary"))
    with georep.sync.GeoSender.from_connection_strings(
        *connections, queue_name=queue, mode=ReplicationMode.ACTIVE
    ) as sender:  # both regions hold every session: the consumers compete in both
        for number in range(per_session):
            sender.send_messages(
                [ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(sessions)]
            )
    out = tmp_path / "handled.log"
    group = f"kill-{uuid.uuid4().hex[:8]}"
    script = str(Path(__file__).with_name("session_consumer.py"))
    consumers = [
        subprocess.Popen(
            [sys.executable, script, *connections, queue, REDIS_URL, group, str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    victim, survivor = consumers
    try:
        for consumer in consumers:
            assert consumer.stdout is not None and consumer.stdout.readline() == "ready\n"
        total = sessions * per_session

        def victim_mid_stream() -> bool:
            """The victim handles sessions (a loaded machine had its first receive come
            after the survivor's 120th message) and a quarter of the messages are done."""
            return str(victim.pid) in _pids(out) and _handled_lines(out) >= total // 4

        deadline = time.monotonic() + 60
        while not victim_mid_stream() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(victim.pid) in _pids(out), "the victim never got a session in 60 s"
        victim.send_signal(signal.SIGKILL)  # mid-stream, holding sessions in both regions
        victim.wait(10)
        killed_at = _handled_lines(out)
        assert 0 < killed_at < total
        deadline = time.monotonic() + 25
        while len(_handled(out)) < total and time.monotonic() < deadline:
            time.sleep(0.1)
        # The survivor settles the other region's copies as duplicates, a session at a
        # time: once none is stored, no duplicate can show up any more.
        deadline = time.monotonic() + 45
        while stored(emu, queue) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {n: emu.namespace(n).message_count(queue) for n in emu.namespaces}
    finally:
        for consumer in consumers:
            if consumer.poll() is None:
                consumer.send_signal(signal.SIGTERM)
                consumer.wait(15)

    records = [line.split() for line in out.read_text().splitlines()]
    pids = {pid for _, pid, _ in records}
    assert pids == {str(victim.pid), str(survivor.pid)}  # both did work
    by_session: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for _, pid, body in sorted(records, key=lambda r: float(r[0])):
        session, number = body.split(":")
        by_session[session].append((int(number), pid))
    for session, handled in by_session.items():
        numbers = [n for n, _ in handled]
        # At most the message the victim was handling when killed runs again (its commit
        # never happened: at-least-once); collapsing those repeats leaves the full order.
        collapsed = [n for i, n in enumerate(numbers) if i == 0 or n != numbers[i - 1]]
        assert collapsed == list(range(per_session)), (session, numbers)
        repeats = [
            handled[i - 1][1] for i in range(1, len(handled)) if numbers[i] == numbers[i - 1]
        ]
        assert all(pid == str(victim.pid) for pid in repeats), (session, handled)
        assert len(repeats) <= 1
    # Nothing left: every copy in both regions was settled while the survivor ran.
    assert sum(left.values()) == 0, left


def _handled(out: Path) -> set[str]:
    return {fields[2] for fields in _lines(out)}


def _pids(out: Path) -> set[str]:
    """The consumers that handled a message so far."""
    return {fields[1] for fields in _lines(out)}


def _lines(out: Path) -> list[list[str]]:
    """``time pid body`` per line the consumers wrote (a line still being written, read
    half, is left for the next look)."""
    if not out.exists():
        return []
    return [f for f in (line.split() for line in out.read_text().splitlines()) if len(f) == 3]


def _handled_lines(out: Path) -> int:
    return len(_handled(out))
