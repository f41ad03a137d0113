"""Service Bus sessions on the emulator, through the real azure-servicebus SDK (sync and
async), written the way the SDK's session samples use them."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from _helpers import queue_fixture
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient as SyncClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import AutoLockRenewer as AsyncAutoLockRenewer, ServiceBusClient
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

SESSION_QUEUE = "orders-by-customer"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    """A private emulator (these tests inject faults) with a session queue made by
    ``Emulator(session_queues=...)``."""
    with Emulator(queues=("plain",), session_queues=(SESSION_QUEUE,)) as emulator:
        yield emulator


session_queue = queue_fixture("sq", requires_session=True)


@pytest.fixture
def sync_client(emu: Emulator) -> Iterator[SyncClient]:
    with SyncClient.from_connection_string(emu.connection_string("primary"), retry_total=0) as sb:
        yield sb


async def _send(client: ServiceBusClient, queue: str, *messages: ServiceBusMessage) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(list(messages))


async def _send_interleaved(
    client: ServiceBusClient, queue: str, sessions: str, count: int
) -> None:
    """``count`` messages to each session named by a letter of ``sessions``, interleaved
    (``a-0``, ``b-0``, ``a-1``...): message ``i`` of session ``a`` has the body ``a-i``."""
    messages = [ServiceBusMessage(f"{s}-{i}", session_id=s) for i in range(count) for s in sessions]
    await _send(client, queue, *messages)


async def _receive(receiver, count: int):  # type: ignore[no-untyped-def]
    received = []
    deadline = time.monotonic() + 10
    while len(received) < count and time.monotonic() < deadline:
        received += await receiver.receive_messages(
            max_message_count=count - len(received), max_wait_time=1
        )
    return received


@contextlib.asynccontextmanager
async def _holding(
    client: ServiceBusClient, queue: str, body: str = "m"
) -> AsyncIterator[tuple[Any, ServiceBusReceivedMessage]]:
    """Send ``body`` in session ``s``, lock the session and receive it: yields the receiver
    and the message."""
    await _send(client, queue, ServiceBusMessage(body, session_id="s"))
    async with client.get_queue_receiver(queue, session_id="s") as receiver:
        (message,) = await _receive(receiver, 1)
        yield receiver, message


async def _locked_again(client: ServiceBusClient, queue: str) -> ServiceBusReceivedMessage:
    """Lock session ``s`` with a new receiver: its one message, received and completed."""
    async with client.get_queue_receiver(queue, session_id="s") as receiver:
        (again,) = await _receive(receiver, 1)
        await receiver.complete_message(again)
    return again


# -- receiving ------------------------------------------------------------------------------


async def test_a_named_session_gets_only_its_messages_in_order(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    await _send_interleaved(emu_client, session_queue, "ab", 5)
    async with emu_client.get_queue_receiver(session_queue, session_id="b") as receiver:
        assert receiver.session.session_id == "b"
        assert receiver.session.locked_until_utc > dt.datetime.now(dt.UTC)
        messages = await _receive(receiver, 5)
        assert [str(m) for m in messages] == [f"b-{i}" for i in range(5)]
        assert {m.session_id for m in messages} == {"b"}
        for message in messages:
            await receiver.complete_message(message)
        assert await receiver.receive_messages(max_wait_time=0.5) == []


async def test_the_queue_made_by_emulator_session_queues_requires_sessions(
    emu_client: ServiceBusClient, emu: Emulator
) -> None:
    await _send(emu_client, SESSION_QUEUE, ServiceBusMessage("hello", session_id="c-1"))
    async with emu_client.get_queue_receiver(
        SESSION_QUEUE, session_id="c-1", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        assert [str(m) for m in await _receive(receiver, 1)] == ["hello"]
    with emu.admin_client("primary") as admin:
        assert admin.get_queue(SESSION_QUEUE).requires_session is True


async def test_next_available_session_locks_a_session_with_messages_and_names_it(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    await _send(emu_client, session_queue, ServiceBusMessage("x", session_id="only"))
    async with emu_client.get_queue_receiver(
        session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "only"
        assert [str(m) for m in await _receive(receiver, 1)] == ["x"]


async def test_next_available_session_skips_a_locked_session(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    await _send(
        emu_client,
        session_queue,
        ServiceBusMessage("1", session_id="first"),
        ServiceBusMessage("2", session_id="second"),
    )
    async with (
        emu_client.get_queue_receiver(session_queue, session_id="first") as holder,
        emu_client.get_queue_receiver(
            session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as other,
    ):
        assert holder.session.session_id == "first"
        assert other.session.session_id == "second"


async def test_next_available_session_waits_for_a_message(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async def send_later() -> None:
        await asyncio.sleep(1)
        await _send(emu_client, session_queue, ServiceBusMessage("late", session_id="late"))

    sending = asyncio.create_task(send_later())
    async with emu_client.get_queue_receiver(
        session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=10
    ) as receiver:
        assert receiver.session.session_id == "late"
    await sending


async def test_next_available_session_times_out_after_max_wait_time(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError, match="max_wait_time"):
        async with emu_client.get_queue_receiver(
            session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
        ) as receiver:
            await receiver.receive_messages(max_wait_time=2)
    # Not at once, and not never: the upper bound is loose, for a loaded machine's
    # connection set-up (seconds under ten parallel workers on two cores).
    assert 1.5 < time.monotonic() - started < 30


# -- refusals -------------------------------------------------------------------------------


async def test_a_message_without_session_id_is_refused_by_a_session_queue(
    emu_client: ServiceBusClient, session_queue: str, emu: Emulator
) -> None:
    with pytest.raises(ServiceBusError, match="SessionId was not set") as refused:
        await _send(emu_client, session_queue, ServiceBusMessage("no session"))
    assert "not-allowed" in str(refused.value)
    assert emu.namespace("primary").message_count(session_queue) == 0


async def test_a_plain_receiver_on_a_session_queue_is_refused(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    with pytest.raises(ServiceBusError, match="requires sessions to create a non-sessionful"):
        async with emu_client.get_queue_receiver(session_queue) as receiver:
            await receiver.receive_messages(max_wait_time=1)


async def test_a_session_receiver_on_a_plain_queue_is_refused_at_once(
    emu_client: ServiceBusClient,
) -> None:
    started = time.monotonic()
    with pytest.raises(ServiceBusError, match="does not require sessions"):
        async with emu_client.get_queue_receiver("plain", session_id="s") as receiver:
            await receiver.receive_messages(max_wait_time=60)
    # At once: well before the 60 s wait would end, whatever the machine's load.
    assert time.monotonic() - started < 30


async def test_a_locked_session_cannot_be_locked_by_a_second_receiver_until_released(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async with emu_client.get_queue_receiver(session_queue, session_id="s"):
        with pytest.raises(SessionCannotBeLockedError, match="'s'"):
            async with emu_client.get_queue_receiver(session_queue, session_id="s") as second:
                await second.receive_messages(max_wait_time=1)
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as third:
        assert third.session.session_id == "s"


# -- the session object ---------------------------------------------------------------------


async def test_session_state_is_kept_across_receivers_and_none_clears_it(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        assert await receiver.session.get_state() is None
        await receiver.session.set_state("step-2")
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        assert await receiver.session.get_state() == b"step-2"
        await receiver.session.set_state(None)
        assert await receiver.session.get_state() is None


async def test_renew_lock_moves_locked_until_forward(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        first = receiver.session.locked_until_utc
        await asyncio.sleep(0.2)
        renewed = await receiver.session.renew_lock()
        assert renewed > first
        assert receiver.session.locked_until_utc == renewed


async def test_list_queue_sessions_names_sessions_with_messages_or_state(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    await _send(
        emu_client,
        session_queue,
        ServiceBusMessage("1", session_id="with-messages"),
        ServiceBusMessage("2", session_id="with-messages"),
    )
    async with emu_client.get_queue_receiver(session_queue, session_id="with-state") as receiver:
        await receiver.session.set_state(b"kept")
    listed = [s async for s in emu_client.list_queue_sessions(session_queue)]
    assert sorted(listed) == ["with-messages", "with-state"]
    updated = [
        s async for s in emu_client.list_queue_sessions(session_queue, state_updated_after=before)
    ]
    assert updated == ["with-state"]


async def test_peek_on_a_session_receiver_shows_only_that_session(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    await _send_interleaved(emu_client, session_queue, "xy", 3)
    async with emu_client.get_queue_receiver(session_queue, session_id="y") as receiver:
        peeked = await receiver.peek_messages(max_message_count=10)
    assert [str(m) for m in peeked] == ["y-0", "y-1", "y-2"]


# -- settlement -----------------------------------------------------------------------------


async def test_abandon_returns_the_message_to_the_head_of_its_session(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    await _send(
        emu_client, session_queue, *(ServiceBusMessage(str(i), session_id="s") for i in range(3))
    )
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        first = (await _receive(receiver, 1))[0]
        await receiver.abandon_message(first)
        again = await _receive(receiver, 3)
        assert [(str(m), m.delivery_count) for m in again] == [("0", 1), ("1", 0), ("2", 0)]


async def test_defer_then_receive_deferred_messages_with_the_session(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async with _holding(emu_client, session_queue, "later") as (receiver, message):
        await receiver.defer_message(message)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        (deferred,) = await receiver.receive_deferred_messages([message.sequence_number])
        assert str(deferred) == "later"
        await receiver.complete_message(deferred)
    async with emu_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        assert await receiver.peek_messages() == []


async def test_dead_lettered_session_messages_go_to_a_dead_letter_queue_without_sessions(
    emu_client: ServiceBusClient, session_queue: str
) -> None:
    async with _holding(emu_client, session_queue, "bad") as (receiver, message):
        await receiver.dead_letter_message(message, reason="invalid", error_description="nope")
    async with emu_client.get_queue_receiver(
        session_queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dead_letters:
        (dead,) = await _receive(dead_letters, 1)
        assert (str(dead), dead.session_id, dead.dead_letter_reason) == ("bad", "s", "invalid")
        await dead_letters.complete_message(dead)


async def test_auto_lock_renewer_keeps_the_session_locked_past_its_lock_duration(
    emu_client: ServiceBusClient, private_queue: Callable[..., str]
) -> None:
    # 3 s: the SDK's renewer checks once a second and renews in the last half of a short lock.
    queue = private_queue("sq", requires_session=True, lock_duration=3)
    await _send(emu_client, queue, ServiceBusMessage("slow work", session_id="s"))
    async with (
        AsyncAutoLockRenewer(max_lock_renewal_duration=10) as renewer,
        emu_client.get_queue_receiver(queue, session_id="s") as receiver,
    ):
        renewer.register(receiver, receiver.session)
        message = (await _receive(receiver, 1))[0]
        await asyncio.sleep(4)
        await receiver.complete_message(message)
        assert receiver.session.auto_renew_error is None


async def test_an_expired_session_lock_is_lost_and_its_messages_come_back(
    emu_client: ServiceBusClient, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("sq", requires_session=True, lock_duration=2)
    await _send(emu_client, queue, ServiceBusMessage("m", session_id="s"))
    async with emu_client.get_queue_receiver(queue, session_id="s") as receiver:
        message = (await _receive(receiver, 1))[0]
        await asyncio.sleep(2.5)
        with pytest.raises(SessionLockLostError):
            await receiver.complete_message(message)
    async with emu_client.get_queue_receiver(queue, session_id="s") as receiver:
        (again,) = await _receive(receiver, 1)
        assert (str(again), again.delivery_count) == ("m", 1)


# -- subscriptions and the admin client -----------------------------------------------------


async def test_admin_created_session_queue_and_subscription(
    emu: Emulator, emu_client: ServiceBusClient
) -> None:
    async with emu.async_admin_client("primary") as admin:
        queue = await admin.create_queue("admin-sessions", requires_session=True)
        await admin.create_topic("admin-topic")
        await admin.create_subscription("admin-topic", "by-session", requires_session=True)
        assert queue.requires_session is True
        assert (await admin.get_subscription("admin-topic", "by-session")).requires_session
    await _send(emu_client, "admin-sessions", ServiceBusMessage("q", session_id="s"))
    async with emu_client.get_queue_receiver("admin-sessions", session_id="s") as receiver:
        assert [str(m) for m in await _receive(receiver, 1)] == ["q"]
    async with emu_client.get_topic_sender("admin-topic") as sender:
        await sender.send_messages(
            [ServiceBusMessage("t", session_id="s"), ServiceBusMessage("no session")]
        )
    async with emu_client.get_subscription_receiver(
        "admin-topic", "by-session", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "s"
        assert [str(m) for m in await _receive(receiver, 1)] == ["t"]
    # A topic accepts it; the session subscription dead-letters it, as the service does.
    async with emu_client.get_subscription_receiver(
        "admin-topic", "by-session", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dead_letters:
        (dead,) = await _receive(dead_letters, 1)
        assert (str(dead), dead.dead_letter_reason) == ("no session", "Session id is null.")


# -- faults ---------------------------------------------------------------------------------


async def test_a_lost_session_lock_fails_settle_renew_and_receive_then_relocks(
    emu_client: ServiceBusClient, emu: Emulator, session_queue: str
) -> None:
    async with _holding(emu_client, session_queue) as (receiver, message):
        assert emu.namespace("primary").expire_session_locks(session_queue) == 1
        await asyncio.sleep(0.2)  # the detach reaches the client
        with pytest.raises(SessionLockLostError):
            await receiver.complete_message(message)
        with pytest.raises(SessionLockLostError):
            await receiver.session.renew_lock()
    again = await _locked_again(emu_client, session_queue)
    assert (str(again), again.delivery_count) == ("m", 1)


# A fault while a session is held: the error the holder's next call raises, and that call.
_HOLDER_FAILS: dict[str, tuple[type[Exception], Callable[[Any], Awaitable[Any]]]] = {
    "outage": (ServiceBusConnectionError, lambda r: r.receive_messages(max_wait_time=1)),
    "blackhole": (OperationTimeoutError, lambda r: r.session.renew_lock(timeout=2)),
}


async def _fault_while_held(
    client: ServiceBusClient, emu: Emulator, queue: str, fault: str
) -> ServiceBusReceivedMessage:
    """Hold session ``s``, inject ``fault`` (a method of the namespace control), check the
    holder's next call fails (``_HOLDER_FAILS``), restore (which drops the faulted connection
    and releases the session), and return the message as a new receiver gets it."""
    control = emu.namespace("primary")
    refused, call = _HOLDER_FAILS[fault]
    async with _holding(client, queue) as (receiver, _):
        getattr(control, fault)()
        with pytest.raises(refused):
            await call(receiver)
        control.restore()
    return await _locked_again(client, queue)


async def test_an_outage_while_a_session_is_held_releases_it_for_the_next_receiver(
    emu_client: ServiceBusClient, emu: Emulator, session_queue: str
) -> None:
    again = await _fault_while_held(emu_client, emu, session_queue, "outage")
    assert str(again) == "m"


async def test_a_blackhole_while_a_session_is_held_times_out_and_restore_frees_it(
    emu_client: ServiceBusClient, emu: Emulator, session_queue: str
) -> None:
    again = await _fault_while_held(emu_client, emu, session_queue, "blackhole")
    assert (str(again), again.delivery_count) == ("m", 1)


def test_georep_fault_session_lock_lost_takes_the_lock_away(
    sync_client: SyncClient, emu: Emulator, session_queue: str
) -> None:
    def georep_fault(*args: str) -> subprocess.CompletedProcess[str]:
        control = ["--control-url", emu.control_url, "--control-token", emu.control_token]
        return subprocess.run(
            [sys.executable, "-m", "georep.cli", "fault", "primary", "session-lock-lost", *args,
             *control],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    with sync_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        lost = georep_fault("--entity", session_queue)
        assert lost.returncode == 0, lost.stdout + lost.stderr
        assert "'session_locks_lost': 1" in lost.stdout
        with pytest.raises(SessionLockLostError):
            receiver.session.renew_lock()
    refused = georep_fault("--entity", "plain")
    assert refused.returncode == 2 and "not session-enabled" in refused.stdout


# -- the sync SDK ---------------------------------------------------------------------------


def test_sync_named_session_state_renew_and_a_lock_conflict(
    sync_client: SyncClient, session_queue: str
) -> None:
    with sync_client.get_queue_sender(session_queue) as sender:
        sender.send_messages([ServiceBusMessage(str(i), session_id="s") for i in range(3)])
    with sync_client.get_queue_receiver(session_queue, session_id="s") as receiver:
        messages = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        assert [str(m) for m in messages] == ["0", "1", "2"]
        for message in messages:
            receiver.complete_message(message)
        receiver.session.set_state("done")
        assert receiver.session.get_state() == b"done"
        assert receiver.session.renew_lock() > dt.datetime.now(dt.UTC)
        with (
            pytest.raises(SessionCannotBeLockedError),
            sync_client.get_queue_receiver(session_queue, session_id="s") as second,
        ):
            second.receive_messages(max_wait_time=1)
    assert sorted(sync_client.list_queue_sessions(session_queue)) == ["s"]


def test_sync_next_available_session_and_its_timeout(
    sync_client: SyncClient, session_queue: str
) -> None:
    with sync_client.get_queue_sender(session_queue) as sender:
        sender.send_messages(ServiceBusMessage("x", session_id="n"))
    with sync_client.get_queue_receiver(
        session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "n"
        (message,) = receiver.receive_messages(max_wait_time=5)
        receiver.complete_message(message)
    # No session has messages now: the next receiver waits 1 s for one, then times out.
    idle = sync_client.get_queue_receiver(
        session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
    )
    with pytest.raises(OperationTimeoutError), idle:
        idle.receive_messages(max_wait_time=1)


def test_sync_auto_lock_renewer_and_a_lost_lock(
    sync_client: SyncClient, emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("sq", requires_session=True, lock_duration=3)
    with sync_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(str(i), session_id="s") for i in range(2)])
    with (
        AutoLockRenewer(max_lock_renewal_duration=10) as renewer,
        sync_client.get_queue_receiver(queue, session_id="s") as receiver,
    ):
        renewer.register(receiver, receiver.session)
        first, second = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        time.sleep(4)
        receiver.complete_message(first)
        emu.namespace("primary").expire_session_locks(queue)
        time.sleep(0.2)
        with pytest.raises(SessionLockLostError):
            receiver.complete_message(second)
    with sync_client.get_queue_receiver(queue, session_id="s") as receiver:
        (again,) = receiver.receive_messages(max_wait_time=5)
        assert (str(again), again.delivery_count) == ("1", 1)
