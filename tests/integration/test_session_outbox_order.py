"""A session's message that the durable outbox stored behind its successors, through the
real SDK on the emulator with a real Redis: the GeoReceiver hands it on first and loses
nothing (docs/sessions.md, "The durable outbox can reorder")."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import eventually, fault_all, on_emulator
from azure.servicebus import ServiceBusMessage

from georep import DrainPolicy, FailoverPolicy, GeoReceiver, GeoSender, SqliteOutbox
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.testing import InMemoryLedger

pytestmark = pytest.mark.integration

SESSIONS = 4
MESSAGES = 5
"""Per session: message 0 sent, 1 queued in the outbox, 2.. sent before the outbox drains."""


async def test_a_message_the_outbox_stored_behind_its_successors_is_handed_on_first(
    emu: Emulator, private_queue: Callable[..., str], seen: RedisSeenSet, tmp_path: Path
) -> None:
    # Before: message 2 of each session found its predecessor behind it in the primary's
    # session and released the session to have both handed out "in order" again, which the
    # broker cannot do (it hands a session out in sequence order). Each release counted a
    # delivery of every copy in hand, until the broker dead-lettered them
    # (MaxDeliveryCountExceeded): acknowledged sends never handled. Seen in the sessions
    # demo under load: two messages lost, their successors handed on as gap "absent".
    queue = private_queue("outboxed", requires_session=True, max_delivery_count=5)
    sent = await send_with_one_queued(emu, queue, tmp_path / "outbox.db")

    handled: dict[str, list[int]] = defaultdict(list)

    async def handle(message: Any) -> None:
        session, number = str(message).split(":")
        handled[session].append(int(number))

    ledger = InMemoryLedger()
    receiver = on_emulator(
        GeoReceiver, emu, queue, seen=seen, sessions=True, max_wait=0.5, order_wait=60.0,
        ledger=ledger,
    )  # fmt: skip
    running = asyncio.create_task(receiver.run(handle))
    try:
        await eventually(lambda: sum(map(len, handled.values())) >= len(sent), within=30)
        await asyncio.sleep(0.5)  # a duplicate would show up now
    finally:
        await receiver.aclose()
        await running

    counts = emu.namespace("primary").entities()[queue]
    assert counts["dead_letter_message_count"] == 0, counts
    assert dict(handled) == {f"s{s}": list(range(MESSAGES)) for s in range(SESSIONS)}
    assert receiver.stats.order_gaps == 0
    processed = [r.message_id for r in ledger.receives if r.outcome == "processed"]
    assert sorted(processed) == sorted(sent)


async def send_with_one_queued(emu: Emulator, queue: str, outbox_path: Path) -> list[str]:
    """Send messages 0..MESSAGES-1 of every session (bodies ``s<session>:<number>``) so that
    each session's broker order is 0, 2, 3, ..., 1: message 1 is queued in the outbox while
    both regions are down and drained after the next ones went straight to the primary.
    Their MessageIds."""
    ids: list[str] = []
    async with (
        SqliteOutbox(outbox_path) as outbox,
        on_emulator(
            GeoSender,
            emu,
            queue,
            outbox=outbox,
            policy=FailoverPolicy(attempt_timeout=1.0),
            # The drainer's first attempt fails (both regions down); it retries 4 s later.
            drain=DrainPolicy(initial_backoff=4.0, max_backoff=4.0, idle_interval=0.1),
        ) as sender,
    ):

        async def send(number: int) -> bool:
            messages = [
                ServiceBusMessage(f"s{s}:{number}", session_id=f"s{s}") for s in range(SESSIONS)
            ]
            result = await sender.send_messages(messages)
            ids.extend(str(m.message_id) for m in messages)
            return bool(result.queued)

        assert not await send(0)
        await fault_all(emu, "outage")
        try:
            assert await send(1)
            tried = await eventually(lambda: _all_attempted(outbox), within=10)
            assert tried, "the drainer never tried the queued messages"
        finally:
            await fault_all(emu, "restore")
        for number in range(2, MESSAGES):
            assert not await send(number)
        assert await outbox.depth() > 0, "drained before the later messages were sent"
        assert await eventually(lambda: _empty(outbox), within=20)
    return ids


async def _all_attempted(outbox: SqliteOutbox) -> bool:
    records = await outbox.records(dead=False)
    return bool(records) and all(r.attempts > 0 for r in records)


async def _empty(outbox: SqliteOutbox) -> bool:
    return await outbox.depth() == 0
