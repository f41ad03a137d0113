"""The drop-in client used the SDK's way at its edges: scheduled messages cancelled from
another process, AMQP annotated messages, partitioned entities, closing and cancelling at
awkward moments, the SDK's attributes. Each test names what an azure-servicebus program
does and checks that it does the same over two emulated regions."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import textwrap
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _helpers import REDIS_URL, eventually, fault, start_child, stored
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
)
from azure.servicebus.aio import ServiceBusClient as SdkClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    SessionLockLostError,
)

from georep import FailoverPolicy, ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient
from georep.servicebus.aio._numbers import region_of

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")
LOCK_SECONDS = 5
"""Lock duration of queues whose copies an outage leaves locked: they come back soon."""


def dropin(emu: Emulator, seen: RedisSeenSet, **options: Any) -> ServiceBusClient:
    """The one changed line (active mode unless told otherwise)."""
    options.setdefault("mode", ReplicationMode.ACTIVE)
    return ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"), emu.connection_string("secondary"), seen=seen, **options
    )


def scheduled(emu: Emulator, queue: str) -> dict[str, int]:
    """Scheduled messages of ``queue`` per region."""
    return {
        region: int(emu.namespace(region).entities()[queue]["scheduled_message_count"])
        for region in REGIONS
    }


def child_program(body: str) -> str:
    """A child process's program: ``body`` runs with ``client``, a drop-in client on the
    two regions (``$PRIMARY``, ``$SECONDARY``) and the seen-set group ``$GROUP``, open;
    ``json`` and ``os`` are imported."""
    return (
        textwrap.dedent(
            """
            import asyncio, json, os
            from georep.adapters.redis import RedisSeenSet
            from georep.servicebus.aio import ServiceBusClient

            async def main():
                async with RedisSeenSet.from_url(
                    os.environ["REDIS_URL"], group=os.environ["GROUP"]
                ) as seen:
                    client = ServiceBusClient.from_connection_strings(
                        os.environ["PRIMARY"], os.environ["SECONDARY"], seen=seen
                    )
                    async with client:
            """
        )
        + textwrap.indent(textwrap.dedent(body).strip(), " " * 12)
        + "\n\nasyncio.run(main())\n"
    )


_CANCEL_PROCESS = child_program(
    """
    async with client.get_queue_sender(os.environ["QUEUE"]) as sender:
        await sender.cancel_scheduled_messages(json.loads(os.environ["NUMBERS"]))
    print("CANCELLED", flush=True)
    """
)


@pytest.mark.parametrize("mode", [ReplicationMode.ACTIVE, ReplicationMode.PASSIVE])
async def test_a_schedule_is_cancelled_by_another_process_after_a_restart(
    emu: Emulator, private_queue: Any, mode: ReplicationMode
) -> None:
    queue = private_queue("sched")
    group = f"test-{uuid.uuid4().hex[:8]}"
    due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        dropin(emu, seen, mode=mode) as client,
        client.get_queue_sender(queue) as sender,
    ):
        numbers = await sender.schedule_messages(
            [ServiceBusMessage("cancel me"), ServiceBusMessage("me too")], due
        )
    # The process that scheduled them is gone; a new one cancels by the numbers alone.
    copies = 2 if mode is ReplicationMode.ACTIVE else 0
    assert scheduled(emu, queue) == {"primary": 2, "secondary": copies}
    child = await start_child(
        _CANCEL_PROCESS,
        emu,
        queue,
        REDIS_URL=REDIS_URL,
        GROUP=group,
        NUMBERS=json.dumps(numbers),
    )
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()[-3000:]
    assert out.decode().split() == ["CANCELLED"]
    # Nothing is scheduled any more in either region: no copy will ever be enqueued.
    assert scheduled(emu, queue) == {"primary": 0, "secondary": 0}


def sdk_client(emu: Emulator) -> SdkClient:
    """The raw SDK's client on the primary, to compare with."""
    return SdkClient.from_connection_string(emu.connection_string("primary"))


async def outcome(call: Any) -> str:
    """What a call did, as a line a program would print."""
    try:
        result = await call()
    except Exception as exc:  # what the SDK raised, by the class an except block names
        return f"raised ValueError={isinstance(exc, ValueError)}"
    return f"returned {result!r}"


async def lifecycle_program(client: Any, queue: str) -> list[str]:
    """Close a receiver while a receive waits in another task, close the client while a
    sender and a receiver are open, then use the client again: the SDK's docs allow each."""
    lines = []
    async with client:
        receiver = client.get_queue_receiver(queue)
        await receiver.__aenter__()
        pending = asyncio.create_task(receiver.receive_messages(10, max_wait_time=60))
        await asyncio.sleep(0)  # the receive is under way
        await receiver.close()
        lines.append(f"pending receive: {await asyncio.wait_for(pending, 30)!r}")
        sender = client.get_queue_sender(queue)
        await sender.__aenter__()
        left_open = client.get_queue_receiver(queue)
        await left_open.__aenter__()
    lines.append("send: " + await outcome(lambda: sender.send_messages(ServiceBusMessage("x"))))
    lines.append("receive: " + await outcome(lambda: left_open.receive_messages(max_wait_time=1)))
    async with client:  # the same client, again
        async with client.get_queue_sender(queue) as again:
            await again.send_messages(ServiceBusMessage("again"))
        async with client.get_queue_receiver(queue) as receiver:
            for message in await receiver.receive_messages(5, max_wait_time=30):
                lines.append(f"received {message}")
                await receiver.complete_message(message)
                try:
                    await receiver.complete_message(message)
                except MessageAlreadySettled:
                    lines.append("completed again: MessageAlreadySettled")
    return lines


async def test_closing_at_awkward_moments_does_what_the_sdk_does(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    raw = await lifecycle_program(sdk_client(emu), private_queue("life"))
    assert raw == [
        "pending receive: []",
        "send: raised ValueError=True",
        "receive: raised ValueError=True",
        "received again",
        "completed again: MessageAlreadySettled",
    ]
    queue = private_queue("life")
    assert await lifecycle_program(dropin(emu, seen), queue) == raw
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "both copies settled"


async def attributes_program(client: Any, queue: str, session_queue: str) -> list[str]:
    """The SDK's attributes of a client, its sender, receivers and session (and the
    per-handler settings the SDK's handlers take)."""
    lines = []
    async with client:
        lines.append(f"client {client.fully_qualified_namespace}")
        async with client.get_queue_sender(
            queue, client_identifier="my-sender", keep_alive=30, auth_timeout=30
        ) as sender:
            lines.append(f"sender {sender.fully_qualified_namespace} {sender.entity_name}")
            lines.append(f"sender id {sender.client_identifier}")
            await sender.send_messages(ServiceBusMessage("s", session_id="cart-1"))
        async with client.get_queue_sender(session_queue) as sender:
            lines.append(f"generated id {sender.client_identifier.split('-')[0]}")
            await sender.send_messages(ServiceBusMessage("s", session_id="cart-1"))
        async with client.get_queue_receiver(
            queue, client_identifier="my-receiver", keep_alive=30
        ) as receiver:
            lines.append(f"receiver {receiver.fully_qualified_namespace} {receiver.entity_path}")
            lines.append(f"receiver id {receiver.client_identifier} session {receiver.session}")
            for message in await receiver.receive_messages(1, max_wait_time=30):
                await receiver.complete_message(message)
        async with client.get_queue_receiver(
            session_queue, session_id=NEXT_AVAILABLE_SESSION
        ) as receiver:
            session = receiver.session
            lines.append(f"generated id {receiver.client_identifier.split('-')[0]}")
            lines.append(f"session {session.session_id} {receiver.entity_path}")
            lines.append(f"locked until {type(session.locked_until_utc).__name__}")
            lines.append(f"renewed {type(await session.renew_lock()).__name__}")
            for message in await receiver.receive_messages(1, max_wait_time=30):
                lines.append(f"{message.session_id}: {message}")
                await receiver.complete_message(message)
        # The session of a closed receiver: the SDK's handler is shut down.
        lines.append("renew after close: " + await outcome(session.renew_lock))
        lines.append("get_state after close: " + await outcome(session.get_state))
        lines.append("set_state after close: " + await outcome(lambda: session.set_state("x")))
    return lines


async def test_the_sdks_attributes_read_the_same(emu: Emulator, seen: RedisSeenSet) -> None:
    names = [f"attr-{uuid.uuid4().hex[:6]}", f"attr-s-{uuid.uuid4().hex[:6]}"]
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(names[0])
        emu.namespace(namespace).create_queue(names[1], requires_session=True)
    raw = await attributes_program(sdk_client(emu), *names)
    assert "sender id my-sender" in raw and "generated id SBReceiver" in raw
    assert await attributes_program(dropin(emu, seen), *names) == raw


async def browse_program(client: Any, queue: str, aside: Any = None) -> list[str]:
    """Peek around receives, receive a number that was never deferred, and settle what is
    not a received message: what SDK programs print for each. ``aside()`` (an async
    context manager) is around the first receiver."""
    lines = []

    async def peeked(receiver: Any) -> str:
        return " ".join(str(m) for m in await receiver.peek_messages(max_message_count=10))

    async with client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(4)])
        async with (
            aside() if aside else contextlib.nullcontext(),
            client.get_queue_receiver(queue) as receiver,
        ):
            lines.append(f"before: {await peeked(receiver)}")
            taken: list[Any] = []
            while len(taken) < 2:  # the SDK may return fewer than asked for
                taken += await receiver.receive_messages(2 - len(taken), max_wait_time=10)
            for message in taken:
                await receiver.complete_message(message)
            # The SDK browses on after the last message received; completed ones are gone.
            lines.append(f"after two: {await peeked(receiver)}")
        async with client.get_queue_receiver(queue) as receiver:
            lines.append(f"new receiver: {await peeked(receiver)}")
            rest: list[Any] = []
            while len(rest) < 2:
                rest += await receiver.receive_messages(2 - len(rest), max_wait_time=10)
            for message in rest:
                await receiver.complete_message(message)
        async with client.get_queue_receiver(queue) as receiver:
            lines.append(f"all completed: {await peeked(receiver)!r}")
            try:
                await receiver.receive_deferred_messages([123_456])
            except MessageNotFoundError:
                lines.append("never deferred: MessageNotFoundError")
            try:
                await receiver.complete_message("not a message")
            except TypeError:
                lines.append("settling a str: TypeError")
    return lines


async def test_browsing_around_receives_shows_what_the_sdk_shows(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    raw = await browse_program(sdk_client(emu), private_queue("browse"))
    assert raw == [
        "before: m0 m1 m2 m3",
        "after two: m2 m3",
        "new receiver: m2 m3",
        "all completed: ''",
        "never deferred: MessageNotFoundError",
        "settling a str: TypeError",
    ]

    @contextlib.asynccontextmanager
    async def secondary_down() -> AsyncIterator[None]:
        # The first receiver reads the primary only; the twins of the two it completes
        # stay in the secondary (active mode) until a receiver meets them: the new
        # receiver's first peek must not show them.
        await fault(emu, "secondary", "outage")
        try:
            yield
        finally:
            await fault(emu, "secondary", "restore")

    queue = private_queue("browse")
    assert await browse_program(dropin(emu, seen), queue, secondary_down) == raw


def taken_not_returned(receiver: Any) -> bool:
    """Whether a receive call holds messages it has not returned yet (it waits a moment
    for more): the moment a cancellation is most awkward. georep's internals, read only."""
    pull = receiver._pull
    return pull is not None and any(h.handed_out for h in pull._held.values())


@pytest.mark.parametrize(
    "mode", [ServiceBusReceiveMode.PEEK_LOCK, ServiceBusReceiveMode.RECEIVE_AND_DELETE]
)
async def test_a_receive_cancelled_mid_call_raises_and_loses_nothing(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet, mode: ServiceBusReceiveMode
) -> None:
    queue = private_queue("cancel-rx")
    handed: list[str] = []
    cancelled_holding = 0
    async with dropin(emu, seen) as client:
        receiver = client.get_queue_receiver(queue, receive_mode=mode)
        async with receiver, client.get_queue_sender(queue) as sender:
            for round_ in range(3):
                call = asyncio.create_task(receiver.receive_messages(10, max_wait_time=60))
                await sender.send_messages(ServiceBusMessage(f"m{round_}"))
                # Spin, one event-loop turn at a time: the call holds a message for only
                # 0.2 s (waiting for more), and a poll's sleep could miss that.
                while not call.done() and not taken_not_returned(receiver):  # noqa: ASYNC110
                    await asyncio.sleep(0)
                if call.cancel():
                    with pytest.raises(asyncio.CancelledError):
                        await call
                    cancelled_holding += 1
                else:
                    handed += [str(m) for m in call.result()]
            while len(handed) < 3:
                got = await receiver.receive_messages(10, max_wait_time=30)
                assert got, f"only {sorted(handed)} came back"
                handed += [str(m) for m in got]
                if mode is ServiceBusReceiveMode.PEEK_LOCK:
                    for message in got:
                        await receiver.complete_message(message)
            assert await receiver.receive_messages(10, max_wait_time=2) == []
    assert cancelled_holding, "no receive was cancelled while it held a message"
    assert sorted(handed) == ["m0", "m1", "m2"], "each once"
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "both copies settled"


async def test_a_send_cancelled_mid_call_raises_and_a_retry_is_handed_out_once(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    queue = private_queue("cancel-tx")
    messages = [ServiceBusMessage(f"m{i}") for i in range(3)]
    async with dropin(emu, seen) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("warm"))  # both links open
            await fault(
                emu, "secondary", "latency", 30
            )  # the primary takes it, not yet the secondary
            call = asyncio.create_task(sender.send_messages(messages))
            assert await eventually(
                lambda: emu.namespace("primary").message_count(queue) == 4, within=30
            )
            assert call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await fault(emu, "secondary", "restore")
            await sender.send_messages(messages)  # the application's retry: the same messages
        handed: list[str] = []
        async with client.get_queue_receiver(queue) as receiver:
            while len(handed) < 4:
                got = await receiver.receive_messages(10, max_wait_time=30)
                assert got, f"only {sorted(handed)} were handed out"
                for message in got:
                    handed.append(str(message))
                    await receiver.complete_message(message)
            assert await receiver.receive_messages(10, max_wait_time=2) == []
    assert sorted(handed) == ["m0", "m1", "m2", "warm"], "each once"
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "every copy settled"


async def partitioned_program(client: Any, queue: str) -> list[str]:
    """Send (one, keyed, a list and a batch of one key), schedule and cancel, peek, receive,
    defer and receive deferred on a partitioned queue, as SDK code does."""
    lines = []
    async with client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("one"))
            await sender.send_messages(ServiceBusMessage("keyed", partition_key="k1"))
            await sender.send_messages(
                [ServiceBusMessage(f"list {i}", partition_key="k2") for i in range(3)]
            )
            batch = await sender.create_message_batch()
            for i in range(2):
                batch.add_message(ServiceBusMessage(f"batch {i}", partition_key="k3"))
            await sender.send_messages(batch)
            due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
            numbers = await sender.schedule_messages(
                ServiceBusMessage("scheduled", partition_key="k4"), due
            )
            await sender.cancel_scheduled_messages(numbers)
        async with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            peeked: list[str] = []
            while len(peeked) < 7:
                page = await receiver.peek_messages(10)
                assert page, f"peeked only {peeked}"
                peeked += [str(message) for message in page]
            lines.append(f"peeked {sorted(peeked)}")
            received, deferred = [], []
            while len(received) < 7:
                for message in await receiver.receive_messages(10, max_wait_time=30):
                    received.append(str(message))
                    if str(message) == "keyed":
                        deferred.append(message.sequence_number)
                        await receiver.defer_message(message)
                    else:
                        await receiver.complete_message(message)
            lines.append(f"received {sorted(received)}")
            for message in await receiver.receive_deferred_messages(deferred):
                lines.append(f"deferred {message}")
                await receiver.complete_message(message)
    return lines


async def test_a_partitioned_queue_is_used_as_the_sdk_uses_it(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    raw = await partitioned_program(
        sdk_client(emu), private_queue("part", enable_partitioning=True)
    )
    assert raw[-1] == "deferred keyed"
    queue = private_queue("part", enable_partitioning=True)
    assert await partitioned_program(dropin(emu, seen), queue) == raw
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "every copy settled"
    assert scheduled(emu, queue) == {"primary": 0, "secondary": 0}


_DEFERRED_PROCESS = child_program(
    """
    async with client.get_queue_receiver(os.environ["QUEUE"]) as receiver:
        for number in json.loads(os.environ["NUMBERS"]):
            got = await receiver.receive_deferred_messages(number)
            print(json.dumps([str(m) for m in got]), flush=True)
            for message in got:
                await receiver.complete_message(message)
    """
)


async def schedule_raw(emu: Emulator, region: str, queue: str, *bodies: str) -> list[int]:
    """Schedule ``bodies`` in one region with the raw SDK, due at once; their numbers."""
    due = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    async with (
        SdkClient.from_connection_string(emu.connection_string(region)) as client,
        client.get_queue_sender(queue) as sender,
    ):
        messages = [ServiceBusMessage(body, message_id=body) for body in bodies]
        return list(await sender.schedule_messages(messages, due))


async def test_deferred_numbers_that_collide_across_regions_round_trip_in_another_process(
    emu: Emulator, private_queue: Any
) -> None:
    """Each region numbers its own copies, so "x" stored only in the primary and "y" only
    in the secondary can carry the same number (as after a passive failover on Azure, where
    each entity numbers from 1). Deferred by one process, each is received by its number in
    another, and only it."""
    queue, filler = private_queue("defer"), private_queue("filler")
    # Bring both regions' next numbers level (a namespace numbers all its entities here).
    (primary,) = await schedule_raw(emu, "primary", filler, "p")
    (secondary,) = await schedule_raw(emu, "secondary", filler, "s")
    behind = "primary" if primary < secondary else "secondary"
    gap = abs(primary - secondary)
    if gap:
        await schedule_raw(emu, behind, filler, *(f"f{i}" for i in range(gap)))
    (x,) = await schedule_raw(emu, "primary", queue, "x")
    (y,) = await schedule_raw(emu, "secondary", queue, "y")
    assert x == y, "the premise: one number in both regions"

    group = f"test-{uuid.uuid4().hex[:8]}"
    numbers: dict[str, int] = {}
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        dropin(emu, seen) as client,
        client.get_queue_receiver(queue, max_wait_time=10) as receiver,
    ):
        while len(numbers) < 2:
            got = await receiver.receive_messages(10, max_wait_time=30)
            assert got, f"only {sorted(numbers)} were handed out"
            for message in got:
                assert message.sequence_number is not None
                numbers[str(message)] = message.sequence_number
                await receiver.defer_message(message)
    assert numbers["x"] != numbers["y"], "each handed-out number names one message"

    child = await start_child(
        _DEFERRED_PROCESS,
        emu,
        queue,
        REDIS_URL=REDIS_URL,
        GROUP=group,
        NUMBERS=json.dumps([numbers["y"], numbers["x"]]),
    )
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()[-3000:]
    assert [json.loads(line) for line in out.decode().splitlines()] == [["y"], ["x"]]
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "both completed"


async def deferred_in(emu: Emulator, region: str, queue: str) -> int:
    """How many deferred messages ``queue`` holds in ``region`` (browsed with the SDK)."""
    async with (
        SdkClient.from_connection_string(emu.connection_string(region)) as client,
        client.get_queue_receiver(queue) as browser,
    ):
        peeked = await browser.peek_messages(max_message_count=50)
        return sum(1 for m in peeked if m.state == ServiceBusMessageState.DEFERRED)


async def test_a_deferred_message_is_found_through_its_twin_by_another_process(
    emu: Emulator, private_queue: Any
) -> None:
    """One process defers a message (active mode: georep defers its copy in the other
    region too); its region goes down; another process sharing the seen-set asks for the
    number it was handed out with, and gets the twin, as the deferring process would."""
    queue = private_queue("twin")
    group = f"test-{uuid.uuid4().hex[:8]}"
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        dropin(emu, seen) as client,
    ):
        number = await defer_one(emu, client, queue)
    down = region_of(number)
    await fault(emu, down, "outage")
    try:
        child = await start_child(
            _DEFERRED_PROCESS,
            emu,
            queue,
            REDIS_URL=REDIS_URL,
            GROUP=group,
            NUMBERS=json.dumps([number]),
        )
        out, err = await child.communicate()
    finally:
        await fault(emu, down, "restore")
    assert child.returncode == 0, err.decode()[-3000:]
    assert [json.loads(line) for line in out.decode().splitlines()] == [["d"]]
    # Its deferred copy in the region that was down is settled by a receiver's sweep.
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        dropin(emu, seen) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        assert await receiver.receive_messages(1, max_wait_time=2) == []
        assert await eventually(lambda: stored(emu, queue) == 0, within=30), "both settled"


async def test_a_deferred_message_completed_through_its_twin_is_not_handed_out_again(
    emu: Emulator, seen: RedisSeenSet, private_queue: Any
) -> None:
    """Deferred in one region; that region goes down; the program gets it by its number
    from the twin and completes it; the region comes back. Asking for the number again
    raises the SDK's MessageNotFoundError, as it does once a deferred message was completed
    (it handed the completed message out a second time), and no copy is left."""
    queue = private_queue("twin-done")
    async with dropin(emu, seen) as client:
        number = await defer_one(emu, client, queue)
        down = region_of(number)
        await fault(emu, down, "outage")
        try:
            async with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
                (again,) = await receiver.receive_deferred_messages([number])
                assert str(again) == "d"
                await receiver.complete_message(again)
        finally:
            await fault(emu, down, "restore")
        async with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
            with pytest.raises(MessageNotFoundError):
                await receiver.receive_deferred_messages([number])
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), "a copy was left"


async def defer_one(emu: Emulator, client: ServiceBusClient, queue: str) -> int:
    """Send "d" to ``queue``, receive and defer it; the number it was handed out with, once
    georep deferred its twin in the other region too (active mode)."""
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("d"))
    async with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
        (message,) = await receiver.receive_messages(1, max_wait_time=30)
        await receiver.defer_message(message)
        number = message.sequence_number
        assert number is not None
        both = await eventually(lambda: all_deferred(emu, queue), within=30)
        assert both, "georep deferred the twin in the other region"
    return number


async def all_deferred(emu: Emulator, queue: str) -> bool:
    return all([await deferred_in(emu, region, queue) == 1 for region in REGIONS])


async def receive_all(receiver: Any, count: int, handed: list[str]) -> None:
    """Receive and complete until ``count`` messages were handed out in all."""
    while len(handed) < count:
        got = await receiver.receive_messages(10, max_wait_time=30)
        assert got, f"only {sorted(handed)} were handed out"
        for message in got:
            handed.append(str(message))
            await receiver.complete_message(message)


@pytest.mark.parametrize("mode", [ReplicationMode.ACTIVE, ReplicationMode.PASSIVE])
async def test_a_blackholed_primary_during_sends_and_pull_receives(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet, mode: ReplicationMode
) -> None:
    queue = private_queue("blackhole", lock_duration=LOCK_SECONDS)
    handed: list[str] = []
    client = dropin(emu, seen, mode=mode, policy=FailoverPolicy(attempt_timeout=3))
    async with (
        client,
        client.get_queue_sender(queue) as sender,
        client.get_queue_receiver(queue) as receiver,
    ):
        await sender.send_messages([ServiceBusMessage(f"before {i}") for i in range(4)])
        (first,) = await receiver.receive_messages(1, max_wait_time=30)
        handed.append(str(first))
        await fault(emu, "primary", "blackhole")  # answers nothing, from now on
        await receiver.complete_message(first)  # a copy of the primary's
        for i in range(3):
            await sender.send_messages(ServiceBusMessage(f"during {i}"))
            assert sender.last_result is not None
            assert sender.last_result.accepted == ("secondary",)
        # Passive mode: the unreceived "before" messages are in the silent primary only.
        await receive_all(receiver, 7 if mode is ReplicationMode.ACTIVE else 4, handed)
    await fault(emu, "primary", "restore")
    # The primary answers again: a receiver on the same seen-set hands out what only it
    # held (passive mode), never again what was completed, and settles those copies.
    async with dropin(emu, seen) as client, client.get_queue_receiver(queue) as receiver:
        await receive_all(receiver, 7, handed)
        # Copies the cut-off receiver had locked come back after the 5 s lock, and go.
        assert await receiver.receive_messages(10, max_wait_time=LOCK_SECONDS + 3) == []
    expected = sorted([*(f"before {i}" for i in range(4)), *(f"during {i}" for i in range(3))])
    assert sorted(handed) == expected, "each once"
    assert await eventually(lambda: stored(emu, queue) == 0, within=60), "every copy settled"


async def test_closing_one_of_two_receivers_during_an_outage_hands_its_messages_to_the_other(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    queue = private_queue("two", lock_duration=LOCK_SECONDS)
    async with dropin(emu, seen) as client, client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
    first_client, other_client = dropin(emu, seen), dropin(emu, seen)  # two processes, alike
    async with first_client, other_client, other_client.get_queue_receiver(queue) as other:
        first = first_client.get_queue_receiver(queue)
        held: list[Any] = []
        async with first:
            while len(held) < 3:
                held += await first.receive_messages(3 - len(held), max_wait_time=30)
            await fault(emu, "primary", "outage")
        # Closed while its region was down: what it held goes to the other receiver.
        handed: list[str] = []
        await receive_all(other, 6, handed)
        assert sorted(handed) == [f"m{i}" for i in range(6)], "each once, none lost"
        await fault(emu, "primary", "restore")
        assert await other.receive_messages(10, max_wait_time=LOCK_SECONDS + 3) == []
    assert await eventually(lambda: stored(emu, queue) == 0, within=60), "every copy settled"


_SESSION_PROCESS = """
import asyncio, os
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import OperationTimeoutError
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

async def main():
    async with RedisSeenSet.from_url(os.environ["REDIS_URL"], group=os.environ["GROUP"]) as seen:
        client = ServiceBusClient.from_connection_strings(
            os.environ["PRIMARY"], os.environ["SECONDARY"], seen=seen
        )
        async with client:
            while True:
                receiver = client.get_queue_receiver(
                    os.environ["QUEUE"], session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
                )
                try:
                    async with receiver:
                        async for message in receiver:
                            print(receiver.session.session_id, message, flush=True)
                            await receiver.complete_message(message)
                except OperationTimeoutError:
                    return

asyncio.run(main())
"""


async def test_two_processes_share_the_sessions_each_session_to_one_in_order(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    queue = f"sess-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue, requires_session=True, lock_duration=10)
    async with dropin(emu, seen) as client, client.get_queue_sender(queue) as sender:
        for index in range(5):
            await sender.send_messages(
                [
                    ServiceBusMessage(f"{n}", session_id=f"cart-{n % 4}")
                    for n in range(index * 4, index * 4 + 4)
                ]
            )
    group = f"test-{uuid.uuid4().hex[:8]}"
    children = [
        await start_child(_SESSION_PROCESS, emu, queue, REDIS_URL=REDIS_URL, GROUP=group)
        for _ in range(2)
    ]
    outputs = [await child.communicate() for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err.decode()[-3000:]
    by_session: dict[str, list[tuple[int, int]]] = {}
    for process, (out, _) in enumerate(outputs):
        for line in out.decode().splitlines():
            session, body = line.split()
            by_session.setdefault(session, []).append((process, int(body)))
    assert sorted(by_session) == [f"cart-{n}" for n in range(4)]
    for session, lines in by_session.items():
        assert len({process for process, _ in lines}) == 1, f"{session} went to both: {lines}"
        bodies = [body for _, body in lines]
        assert bodies == sorted(bodies) and len(bodies) == 5, f"{session}: {bodies}"


async def test_copies_fetched_ahead_go_back_unseen_without_counting_a_delivery(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet
) -> None:
    """A receiver with a prefetch holds copies the program never got; closing it hands
    them back as the SDK hands back its buffer (AMQP ``released``), so a program that
    opens a receiver, takes one message and closes, again and again, never has the
    others dead-lettered for deliveries it never saw."""
    queue = private_queue("ahead", max_delivery_count=2)
    async with dropin(emu, seen) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(8)])
        handled: list[str] = []
        for _ in range(4):
            async with client.get_queue_receiver(queue, prefetch_count=5) as receiver:
                (message,) = await receiver.receive_messages(1, max_wait_time=30)
                handled.append(str(message))
                assert message.delivery_count == 0, f"{message} was counted as delivered before"
                await receiver.complete_message(message)
                assert await eventually(
                    lambda receiver=receiver: sum(receiver.stats.received.values()) >= 6,
                    within=30,
                ), "the prefetch filled"
        dead = {region: emu.namespace(region).entities()[queue] for region in REGIONS}
        assert all(counts["dead_letter_message_count"] == 0 for counts in dead.values())
        async with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            async for message in receiver:
                handled.append(str(message))
                await receiver.complete_message(message)
    assert sorted(handled) == [f"m{i}" for i in range(8)]


async def test_sessions_are_listed_as_the_sdk_lists_them_once_across_both_regions(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    """``list_queue_sessions`` / ``list_subscription_sessions``, async and blocking: each
    session once, whichever regions hold it; the other region's while one is down; the
    SDK's errors when both refuse or none answers."""
    queue, topic = f"lists-{uuid.uuid4().hex[:6]}", f"listt-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue, requires_session=True)
        emu.namespace(namespace).create_topic(topic)
    async with (
        SdkClient.from_connection_string(emu.connection_string("primary")) as east,
        SdkClient.from_connection_string(emu.connection_string("secondary")) as west,
    ):
        # "both" in both regions (active replication), the others in one region each.
        for raw, sessions in ((east, ("both", "east-only")), (west, ("both", "west-only"))):
            async with raw.get_queue_sender(queue) as sender:
                await sender.send_messages([ServiceBusMessage("x", session_id=s) for s in sessions])
        sdk_listed = [s async for s in east.list_queue_sessions(queue)]
    assert sorted(sdk_listed) == ["both", "east-only"]  # what the SDK lists of one region

    async with dropin(emu, seen) as client:
        listed = client.list_queue_sessions(queue)  # lazily, as the SDK's
        assert [s async for s in listed] == ["both", "east-only", "west-only"]
        with pytest.raises(ValueError, match="greater than 0"):
            client.list_queue_sessions(queue, timeout=0)
        await fault(emu, "primary", "outage")
        try:
            assert [s async for s in client.list_queue_sessions(queue, timeout=30)] == [
                "both",
                "west-only",
            ]
            await fault(emu, "secondary", "outage")
            with pytest.raises(ServiceBusConnectionError):
                [s async for s in client.list_queue_sessions(queue, timeout=30)]
            for region in REGIONS:  # both accept the connection and never answer
                await fault(emu, region, "restore")
                await fault(emu, region, "blackhole")
            with pytest.raises(OperationTimeoutError):
                [s async for s in client.list_queue_sessions(queue, timeout=1)]
        finally:
            await fault(emu, "primary", "restore")
            await fault(emu, "secondary", "restore")
        with pytest.raises(MessagingEntityNotFoundError):
            [s async for s in client.list_queue_sessions(f"missing-{uuid.uuid4().hex[:6]}")]
        # A session-enabled subscription: created through the SDK's admin client.
        for namespace in REGIONS:
            with emu.admin_client(namespace) as admin:
                admin.create_subscription(topic, "carts", requires_session=True)
        async with client.get_topic_sender(topic) as sender:
            await sender.send_messages(ServiceBusMessage("y", session_id="sub-session"))
        assert [s async for s in client.list_subscription_sessions(topic, "carts")] == [
            "sub-session"
        ]

    def blocking() -> list[str]:
        from georep.servicebus import ServiceBusClient as BlockingClient

        blocking_seen = RedisSeenSet.from_url(REDIS_URL, group=f"lists-{uuid.uuid4().hex[:8]}")
        with BlockingClient.from_connection_strings(
            emu.connection_string("primary"), emu.connection_string("secondary"), seen=blocking_seen
        ) as client:
            return list(client.list_queue_sessions(queue))

    assert await asyncio.to_thread(blocking) == ["both", "east-only", "west-only"]


async def test_a_session_taken_by_another_receiver_after_its_lock_was_lost_raises_lock_lost(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    """The session's locks expire in both regions and another receiver locks the session:
    the first receiver's next receive raises the SDK's ``SessionLockLostError``, as the
    SDK's does (the usual loop then accepts a session again), not a connection error."""
    queue = f"lost-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue, requires_session=True)
    async with dropin(emu, seen) as first, dropin(emu, seen) as second:
        async with first.get_queue_sender(queue) as sender:
            await sender.send_messages(
                [ServiceBusMessage(f"m{i}", session_id="s") for i in range(4)]
            )
        async with first.get_queue_receiver(queue, session_id="s", max_wait_time=3) as receiver:
            (message,) = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
            await receiver.complete_message(message)
            for namespace in REGIONS:
                await asyncio.to_thread(emu.namespace(namespace).expire_session_locks, queue)
            async with second.get_queue_receiver(queue, session_id="s", max_wait_time=3) as other:
                taken = await other.receive_messages(max_message_count=1, max_wait_time=3)
                assert [str(m) for m in taken] == ["m1"]
                await other.complete_message(taken[0])
                with pytest.raises(SessionLockLostError):
                    await receiver.receive_messages(max_message_count=1, max_wait_time=10)


@pytest.mark.parametrize("mode", [ReplicationMode.ACTIVE, ReplicationMode.PASSIVE])
async def test_a_loop_that_drains_until_a_short_batch_gets_every_message(
    emu: Emulator, seen: RedisSeenSet, mode: ReplicationMode
) -> None:
    """``receive_messages(5)`` with messages waiting returns 5, as the SDK's does, also when
    the call begins with copies read ahead or one region's copies come first: the common
    loop that stops at the first short batch handles every message (it stopped after 16
    of 20: a call returned 1 while 4 more were on their way from a region)."""
    queue = f"drain-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue)
    async with dropin(emu, seen, mode=mode) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(20)])
        sizes = []
        async with client.get_queue_receiver(queue) as receiver:
            while True:
                batch = await receiver.receive_messages(max_message_count=5, max_wait_time=3)
                sizes.append(len(batch))
                for message in batch:
                    await receiver.complete_message(message)
                if len(batch) < 5:
                    break
    assert sizes == [5, 5, 5, 5, 0]


async def test_the_sdk_clients_keywords_on_the_changed_line_reach_both_regions(
    emu: Emulator, seen: RedisSeenSet, caplog: pytest.LogCaptureFixture
) -> None:
    """``from_connection_string(conn, retry_total=..., logging_enable=True, ...)`` becomes
    ``from_connection_strings(primary, secondary, seen=seen, <the same keywords>)``: the
    program runs, and the SDK's network trace (``logging_enable``) shows both regions'
    connections opening."""
    queue = f"kw-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue)
    client = dropin(
        emu,
        seen,
        retry_total=2,
        retry_backoff_factor=0.1,
        retry_backoff_max=1,
        retry_mode="exponential",
        logging_enable=True,
        user_agent="shop",
        socket_timeout=0.5,
        keep_alive=30,
        auth_timeout=30,
    )
    caplog.set_level("DEBUG", logger="azure.servicebus._pyamqp")
    async with client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        got: list[str] = []
        async with client.get_queue_receiver(queue, max_wait_time=3) as receiver:
            async for message in receiver:
                got.append(str(message))
                await receiver.complete_message(message)
    assert sorted(got) == ["m0", "m1", "m2"]
    # The network trace (DEBUG frames) comes only with logging_enable: the sender's
    # connection to each region opens with the user agent given.
    opens = [r.getMessage() for r in caplog.records if r.getMessage().startswith("-> OpenFrame")]
    senders = {line.split("'")[1] for line in opens if "SBSender" in line and "'shop " in line}
    assert len(senders) == 2, opens[:4]


async def largest_accepted(sender: Any, make: Any, low: int, high: int) -> int:
    """The largest body size in ``[low, high)`` that ``sender`` sends (by bisection)."""
    while low + 1 < high:
        middle = (low + high) // 2
        try:
            await sender.send_messages(make(middle))
            low = middle
        except MessageSizeExceededError:
            high = middle
    return low


@pytest.mark.parametrize("kind", ["amqp", "dict", "message"])
async def test_a_single_message_as_large_as_the_sdk_sends_is_sent(
    emu: Emulator, seen: RedisSeenSet, kind: str
) -> None:
    """The largest message the SDK sends, given as an ``AmqpAnnotatedMessage``, a dict or a
    ``ServiceBusMessage`` with its MessageId set: georep sends it too, and refuses the next
    byte with the SDK's class (an AMQP message went as a one-message batch, 64 bytes more,
    and was refused up to 64 bytes below the SDK's limit)."""
    queue = f"big-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue)

    def make(size: int) -> Any:
        message_id = uuid.uuid4().hex
        if kind == "amqp":
            return AmqpAnnotatedMessage(
                data_body=b"x" * size, properties={"message_id": message_id}
            )
        if kind == "dict":
            return {"body": "x" * size, "message_id": message_id}
        return ServiceBusMessage(b"x" * size, message_id=message_id)

    raw = SdkClient.from_connection_string(emu.connection_string("primary"))
    async with raw, raw.get_queue_sender(queue) as sender:
        limit = await largest_accepted(sender, make, 255_000, 263_000)
    client = dropin(emu, seen, mode=ReplicationMode.PASSIVE)
    async with client, client.get_queue_sender(queue) as sender:
        await sender.send_messages(make(limit))
        with pytest.raises(MessageSizeExceededError):
            await sender.send_messages(make(limit + 1))


@pytest.mark.parametrize("mode", [ReplicationMode.ACTIVE, ReplicationMode.PASSIVE])
async def test_a_receiver_left_open_after_its_loop_broke_holds_nothing_back(
    emu: Emulator, seen: RedisSeenSet, mode: ReplicationMode
) -> None:
    """``for msg in receiver: ... break``, the receiver kept open and idle: the SDK's
    (no prefetch) holds nothing more, so a second receiver gets every other message. georep
    read ahead while the loop kept up, and renewed those copies' locks for as long as the
    first receiver stayed open."""
    queue = f"idle-{uuid.uuid4().hex[:6]}"
    for namespace in REGIONS:
        emu.namespace(namespace).create_queue(queue, lock_duration=LOCK_SECONDS)
    client = dropin(emu, seen, mode=mode)
    async with client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(20)])
        async with client.get_queue_receiver(queue, max_wait_time=5) as first:
            handled = 0
            async for message in first:
                await first.complete_message(message)
                handled += 1
                if handled == 2:
                    break
            rest: list[str] = []
            async with client.get_queue_receiver(queue) as second:
                loop = asyncio.get_running_loop()
                until = loop.time() + 3 * LOCK_SECONDS  # well before the idle one closes
                while len(rest) < 18 and loop.time() < until:
                    for message in await second.receive_messages(20, max_wait_time=1):
                        rest.append(str(message))
                        await second.complete_message(message)
            assert len(rest) == 18, "the first receiver, open and idle, held some back"
            assert await first.receive_messages(5, max_wait_time=1) == []
