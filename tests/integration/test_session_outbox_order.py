"""A session's order through the durable outbox, with the real SDK on the emulator, real
SQLite and, for the receiver, a real Redis (docs/sessions.md §5):

- a session whose message went to the outbox during an outage: its later sends, during the
  outage and after it, reach the broker behind it, in session order;
- the same after the sending process was killed (SIGKILL) with the session's messages in
  the outbox: a new process's sends of the session wait behind them;
- a message stored behind its successors anyway (the stamps say so) is handed on first by
  the GeoReceiver, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import PACE, eventually, fault_all, on_emulator, start_child
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from georep import DrainPolicy, FailoverPolicy, GeoReceiver, GeoSender, SqliteOutbox
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.send.ordering import PREV_PROPERTY, SEQ_PROPERTY, WRITER_PROPERTY
from georep.testing import InMemoryLedger

pytestmark = pytest.mark.integration

SESSIONS = 4
MESSAGES = 5

# The drainer's first attempt fails (both regions down); its next one comes this many
# seconds later, so what was queued is certainly still in the outbox when the outage ends
# and the session's next sends are made (the case under test), whatever the machine's load.
HOLD = 6.0


async def broker_order(emu: Emulator, queue: str, counts: dict[str, int]) -> dict:
    """The bodies of each session of ``counts`` in the primary, in the broker's order
    (received and deleted): up to its count, or until a receive waits 5 s for nothing."""
    order: dict[str, list[str]] = {}
    async with ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client:
        for session, count in counts.items():
            got: list[str] = []
            async with client.get_queue_receiver(
                queue, session_id=session, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as receiver:
                while len(got) < count:
                    batch = await receiver.receive_messages(max_message_count=50, max_wait_time=5)
                    if not batch:
                        break
                    got.extend(str(m) for m in batch)
            order[session] = got
    return order


async def attempted(outbox: SqliteOutbox, *, oldest: bool = False) -> bool:
    """The drainer tried every entry (or the oldest) once, and backed off for HOLD seconds.

    An entry queued behind its session's earlier one is not tried while that one waits.
    """
    records = await outbox.records(dead=False)
    return bool(records) and all(r.attempts > 0 for r in records[: 1 if oldest else None])


async def empty(outbox: SqliteOutbox) -> bool:
    return await outbox.depth() == 0


async def test_a_session_sent_through_an_outage_reaches_the_broker_in_order(
    emu: Emulator, private_queue: Callable[..., str], tmp_path: Path
) -> None:
    # Before: message 1 (queued during the outage) was delivered after messages 2..4,
    # which went straight to the primary once it was back: broker order 0, 2, 3, 4, 1.
    queue = private_queue("ordered", requires_session=True)
    sessions = [f"s{s}" for s in range(SESSIONS)]
    async with (
        SqliteOutbox(tmp_path / "outbox.db") as outbox,
        on_emulator(
            GeoSender,
            emu,
            queue,
            outbox=outbox,
            # 1 s, stretched on a slower machine: there the primary, up and loaded, did not
            # answer the first send within 1 s and it was queued.
            policy=FailoverPolicy(attempt_timeout=1.0 * PACE),
            drain=DrainPolicy(initial_backoff=HOLD, max_backoff=HOLD, idle_interval=0.1),
        ) as sender,
    ):

        async def send(number: int, session: str = "") -> Any:
            names = [session] if session else sessions
            return await sender.send_messages(
                [ServiceBusMessage(f"{name}:{number}", session_id=name) for name in names]
            )

        for session in sessions:
            assert not (await send(0, session)).queued
        await fault_all(emu, "outage")
        try:
            for session in sessions:  # one send per session: a session's own order
                assert (await send(1, session)).queued
            assert await eventually(lambda: attempted(outbox), within=30)
            assert (await send(2, sessions[0])).queued  # during the outage
        finally:
            await fault_all(emu, "restore")
        for number in (2, 3, 4):
            for session in sessions[1:] if number == 2 else sessions:
                behind = await send(number, session)
                # Both regions answer, yet it waits behind the session's queued messages.
                assert behind.queued and not behind.failed, (session, number, behind)
        fresh = await send(0, "fresh")  # a session with nothing queued goes straight on
        assert fresh.accepted == ("primary",) and not fresh.queued
        assert await eventually(lambda: empty(outbox), within=60)
        assert sender.stats.dead_lettered == 0

    order = await broker_order(emu, queue, {**dict.fromkeys(sessions, MESSAGES), "fresh": 1})
    expected = {s: [f"{s}:{n}" for n in range(MESSAGES)] for s in sessions}
    assert order == {**expected, "fresh": ["fresh:0"]}


CHILD_SENDER = """
import asyncio, os
from azure.servicebus import ServiceBusMessage
from georep import DrainPolicy, FailoverPolicy, GeoSender, SqliteOutbox

async def main():
    hold = float(os.environ["HOLD"])
    async with SqliteOutbox(os.environ["OUTBOX"]) as outbox:
        sender = GeoSender.from_connection_strings(
            os.environ["PRIMARY"], os.environ["SECONDARY"], queue_name=os.environ["QUEUE"],
            outbox=outbox, policy=FailoverPolicy(attempt_timeout=1.0),
            drain=DrainPolicy(initial_backoff=hold, max_backoff=hold, idle_interval=0.1),
        )
        for number in (1, 2):
            result = await sender.send_messages(ServiceBusMessage(f"s:{number}", session_id="s"))
            assert result.queued, result
        print("queued", flush=True)
        await asyncio.Event().wait()  # killed here

asyncio.run(main())
"""


async def test_a_new_process_sends_a_session_behind_what_a_killed_one_left_queued(
    emu: Emulator, private_queue: Callable[..., str], tmp_path: Path
) -> None:
    # Before: the new process's message 3 went straight to the primary, ahead of 1 and 2.
    queue = private_queue("restart", requires_session=True)
    path = tmp_path / "outbox.db"
    await fault_all(emu, "outage")
    child = await start_child(CHILD_SENDER, emu, queue, OUTBOX=str(path), HOLD=str(HOLD))
    try:
        assert child.stdout is not None and child.stderr is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if b"queued" not in line:
            pytest.fail(f"the child did not queue: {(await child.stderr.read()).decode()[-3000:]}")
        async with SqliteOutbox(path) as outbox:
            assert await eventually(lambda: attempted(outbox, oldest=True), within=30)
            [_, second] = await outbox.records(dead=False)
            assert second.attempts == 0, "behind the first, never tried before it"
    finally:
        child.kill()
        await child.wait()
    await fault_all(emu, "restore")

    async with (
        SqliteOutbox(path) as outbox,
        on_emulator(
            GeoSender, emu, queue, outbox=outbox, policy=FailoverPolicy(attempt_timeout=5.0 * PACE)
        ) as sender,
    ):
        behind = await sender.send_messages(ServiceBusMessage("s:3", session_id="s"))
        assert behind.queued and not behind.failed, behind
        assert await eventually(lambda: empty(outbox), within=60)
        after = await sender.send_messages(ServiceBusMessage("s:4", session_id="s"))
        assert after.accepted == ("primary",), "drained: the session goes straight on again"

    assert await broker_order(emu, queue, {"s": 4}) == {"s": ["s:1", "s:2", "s:3", "s:4"]}


async def test_a_message_stored_behind_its_successors_is_handed_on_first(
    emu: Emulator, private_queue: Callable[..., str], seen: RedisSeenSet
) -> None:
    # The broker holds each session as 0, 2, 3, 4, 1 (stamped as one writer's 0..4), as an
    # older georep's outbox left it. Before: message 2 found its predecessor behind it and
    # released the session to have both handed out "in order" again, which the broker
    # cannot do (it hands a session out in sequence order). Each release counted a delivery
    # of every copy in hand, until the broker dead-lettered them (MaxDeliveryCountExceeded):
    # acknowledged sends never handled.
    queue = private_queue("outboxed", requires_session=True, max_delivery_count=5)
    sent = await send_stamped_out_of_order(emu, queue)

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


async def send_stamped_out_of_order(emu: Emulator, queue: str) -> list[str]:
    """Messages 0..MESSAGES-1 of every session (bodies ``s<session>:<number>``), stamped as
    one writer's, stored in the primary as 0, 2, 3, ..., 1. Their MessageIds."""
    writer = uuid.uuid4().hex
    ids = {(s, n): f"s{s}-{n}-{writer[:8]}" for s in range(SESSIONS) for n in range(MESSAGES)}

    def stamped(session: int, number: int) -> ServiceBusMessage:
        properties = {WRITER_PROPERTY: writer, SEQ_PROPERTY: str(number + 1)}
        if number:
            properties[PREV_PROPERTY] = ids[(session, number - 1)]
        return ServiceBusMessage(
            f"s{session}:{number}",
            session_id=f"s{session}",
            message_id=ids[(session, number)],
            application_properties=properties,  # type: ignore[arg-type]
        )

    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client,
        client.get_queue_sender(queue) as sdk_sender,
    ):
        for number in [0, *range(2, MESSAGES), 1]:
            await sdk_sender.send_messages([stamped(s, number) for s in range(SESSIONS)])
    return list(ids.values())
