"""What the real SDK does under load and that Azure tolerates, against the emulator.

- Concurrent settlement and lock renewal on one receiver (``asyncio.gather``, threads,
  ``AutoLockRenewer``): the SDK numbers concurrent transfers out of order on its session;
  the connection must survive it.
- Abandon: the delivery count grows once per delivery to the application, not when the
  SDK releases a message that reached its buffer between receive calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from azure.servicebus import (
    AutoLockRenewer as SyncAutoLockRenewer,
    ServiceBusClient as SyncClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
)
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

COUNT = 12


@pytest.fixture
def sync_client(georep_emulator: Emulator) -> Iterator[SyncClient]:
    with SyncClient.from_connection_string(georep_emulator.connection_string("primary")) as sb:
        yield sb


async def _send(client: ServiceBusClient, queue: str, count: int) -> str:
    """Send ``count`` messages to ``queue``; returns ``queue``."""
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(count)])
    return queue


def _send_sync(client: SyncClient, queue: str, count: int) -> str:
    """Send ``count`` messages to ``queue``; returns ``queue``."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(count)])
    return queue


async def _receive(receiver: object, count: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + 15
    while len(got) < count and time.monotonic() < deadline:
        got += await receiver.receive_messages(  # type: ignore[attr-defined]
            max_message_count=count - len(got), max_wait_time=2
        )
    assert len(got) == count
    return got


@contextlib.asynccontextmanager
async def _holding_all(
    client: ServiceBusClient, queue: str
) -> AsyncIterator[tuple[Any, list[ServiceBusReceivedMessage]]]:
    """A receiver on ``queue`` and the ``COUNT`` messages it received (locked)."""
    async with client.get_queue_receiver(queue) as receiver:
        yield receiver, await _receive(receiver, COUNT)


def _receive_sync(receiver: object, count: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + 15
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(  # type: ignore[attr-defined]
            max_message_count=count - len(got), max_wait_time=2
        )
    assert len(got) == count
    return got


# -- concurrent settlement on one link ------------------------------------------------------
async def test_gathered_renew_and_complete_keep_the_connection(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = await _send(client, make_queue(lock_duration=30), COUNT)
    async with _holding_all(client, queue) as (receiver, messages):
        for _ in range(2):
            renewed = await asyncio.gather(*(receiver.renew_message_lock(m) for m in messages))
            assert len(renewed) == COUNT
        await asyncio.gather(*(receiver.complete_message(m) for m in messages))
    assert georep_emulator.namespace("primary").message_count(queue) == 0


async def test_gathered_settlements_of_every_kind(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = await _send(client, make_queue(lock_duration=30), COUNT)
    async with _holding_all(client, queue) as (receiver, messages):
        settle = (
            receiver.complete_message,
            receiver.abandon_message,
            receiver.dead_letter_message,
            receiver.defer_message,
        )
        await asyncio.gather(*(settle[i % 4](m) for i, m in enumerate(messages)))
    runtime = georep_emulator.namespace("primary").entities()[queue]
    assert runtime["dead_letter_message_count"] == COUNT // 4
    # abandoned (back to available) + deferred
    assert runtime["active_message_count"] == COUNT // 2


async def test_auto_lock_renewer_with_many_messages(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    # A 20 s lock, the locks running out 0.5 s apart: the renewer renews 10 s before a lock
    # runs out, and a 5 s lock renewed at one instant for all 12 lost one under the suite's
    # load (a fresh-clone run), as the sync test below did.
    queue = await _send(client, make_queue(lock_duration=20), COUNT)
    failures: list[BaseException | None] = []

    async def on_failure(_renewable: object, error: BaseException | None) -> None:
        failures.append(error)

    async with (
        client.get_queue_receiver(queue) as receiver,
        AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=on_failure) as renewer,
    ):
        messages = await _receive(receiver, COUNT)
        for message in messages:
            await receiver.renew_message_lock(message)
            await asyncio.sleep(0.5)
        for message in messages:
            renewer.register(receiver, message)
        await asyncio.sleep(23)  # past every lock: only renewal keeps the locks
        await asyncio.gather(*(receiver.complete_message(m) for m in messages))
    assert failures == []
    assert georep_emulator.namespace("primary").message_count(queue) == 0


@pytest.mark.skip(
    reason="the SDK's sync receiver is not thread-safe: settling from a thread pool can leave "
    "one thread blocked forever in SSLTransport._read for an answer another thread already "
    "took off the shared connection (a fresh-clone run hung here for more than 12 minutes, "
    "past pytest's timeout); the out-of-order transfers this covered are exercised by the "
    "async gather test and by the sync AutoLockRenewer test"
)
def test_threads_settling_on_one_sync_receiver(
    sync_client: SyncClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = _send_sync(sync_client, make_queue(lock_duration=30), COUNT)
    with (
        sync_client.get_queue_receiver(queue) as receiver,
        ThreadPoolExecutor(max_workers=6) as pool,
    ):
        messages = _receive_sync(receiver, COUNT)
        list(pool.map(receiver.renew_message_lock, messages))
        list(pool.map(receiver.complete_message, messages))
    assert georep_emulator.namespace("primary").message_count(queue) == 0


def test_sync_auto_lock_renewer_with_many_messages(
    sync_client: SyncClient,
    make_queue: Callable[..., str],
    georep_emulator: Emulator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The SDK's debug log is kept: it names a failed renewal's own error, where the error
    # level shows only the closed handler that follows it.
    caplog.set_level(logging.DEBUG, logger="azure.servicebus")
    # A 20 s lock: the renewer renews once a lock has under 10 s left, so a 10 s lock left
    # its threads no slack, and on a loaded machine one lagged past the expiry.
    queue = _send_sync(sync_client, make_queue(lock_duration=20), COUNT)
    failures: list[BaseException | None] = []
    renewer = SyncAutoLockRenewer(
        max_lock_renewal_duration=30,
        # A failure that matters: a lock lost before the test completed its message (a
        # renewal still under way when the receiver closes fails too, harmlessly).
        on_lock_renew_failure=lambda renewable, error: (
            None if renewable._settled else failures.append(error)
        ),
    )
    # The renewer outside the receiver, as the SDK's samples nest them: the receiver closes
    # first. The other way round, closing the renewer waits for its threads while one of
    # them may wait, forever, for an answer another thread took off the receiver's shared
    # connection (the SDK's sync receiver is not thread-safe; seen once in a full run:
    # pytest's 300 s timeout in ThreadPoolExecutor.shutdown); a closed receiver ends it.
    with renewer, sync_client.get_queue_receiver(queue) as receiver:
        messages = _receive_sync(receiver, COUNT)
        # The locks run out 0.5 s apart, as for messages received over a few seconds. The
        # renewer renews a lock 10 s before it runs out, and the renewals share the
        # receiver's one connection: all 12 at one instant, at the suite's start-up load,
        # took more than those 10 s (twice in fresh-clone runs; the debug log showed 11
        # renewed, then the emulator answering 410, lock expired, for the twelfth).
        for message in messages:
            receiver.renew_message_lock(message)
            time.sleep(0.5)
        for message in messages:
            renewer.register(receiver, message)
        time.sleep(23)  # beyond every lock: only renewals keep them
        assert failures == []
        for message in messages:
            receiver.complete_message(message)
    assert failures == []
    assert georep_emulator.namespace("primary").message_count(queue) == 0


# -- abandon and the delivery count ---------------------------------------------------------
async def test_abandoned_message_returns_counted_once(
    client: ServiceBusClient, make_queue: Callable[..., str]
) -> None:
    queue = await _send(client, make_queue(lock_duration=30), 5)
    async with client.get_queue_receiver(queue) as receiver:
        first = await receiver.receive_messages(max_message_count=20, max_wait_time=3)
        assert len(first) == 5
        assert all(m.delivery_count == 0 for m in first)
        await receiver.abandon_message(first[0])
        for message in first[1:]:
            await receiver.complete_message(message)
        await asyncio.sleep(1)  # the SDK releases what reaches it between receive calls
        [again] = await _receive(receiver, 1)
        assert again.sequence_number == first[0].sequence_number
        assert again.delivery_count == 1
        await receiver.complete_message(again)


def test_abandoned_message_returns_counted_once_sync(
    sync_client: SyncClient, make_queue: Callable[..., str]
) -> None:
    queue = _send_sync(sync_client, make_queue(lock_duration=30), 5)
    with sync_client.get_queue_receiver(queue) as receiver:
        first = receiver.receive_messages(max_message_count=20, max_wait_time=3)
        assert len(first) == 5
        receiver.abandon_message(first[0])
        for message in first[1:]:
            receiver.complete_message(message)
        time.sleep(1)
        [again] = _receive_sync(receiver, 1)
        assert again.sequence_number == first[0].sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


async def test_abandon_up_to_max_delivery_count_minus_one_keeps_the_message(
    client: ServiceBusClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = await _send(client, make_queue(lock_duration=30, max_delivery_count=3), 5)
    async with client.get_queue_receiver(queue) as receiver:
        for attempt in range(3):
            # Credit for 20 left over each time: what the SDK does with it must not count.
            batch = await receiver.receive_messages(max_message_count=20, max_wait_time=3)
            target = min(batch, key=lambda m: m.sequence_number)
            assert target.delivery_count == attempt
            for message in batch:
                if message is not target:
                    await receiver.complete_message(message)
            if attempt < 2:
                await receiver.abandon_message(target)
                await asyncio.sleep(1)
            else:
                await receiver.complete_message(target)
    runtime = georep_emulator.namespace("primary").entities()[queue]
    assert runtime["dead_letter_message_count"] == 0
    assert runtime["active_message_count"] == 0


def test_abandon_up_to_max_delivery_count_minus_one_sync(
    sync_client: SyncClient, make_queue: Callable[..., str], georep_emulator: Emulator
) -> None:
    queue = _send_sync(sync_client, make_queue(lock_duration=30, max_delivery_count=3), 5)
    with sync_client.get_queue_receiver(queue) as receiver:
        for attempt in range(3):
            batch = receiver.receive_messages(max_message_count=20, max_wait_time=3)
            target = min(batch, key=lambda m: m.sequence_number)
            assert target.delivery_count == attempt
            for message in batch:
                if message is not target:
                    receiver.complete_message(message)
            if attempt < 2:
                receiver.abandon_message(target)
                time.sleep(1)
            else:
                receiver.complete_message(target)
    runtime = georep_emulator.namespace("primary").entities()[queue]
    assert runtime["dead_letter_message_count"] == 0
    assert runtime["active_message_count"] == 0


def test_running_says_whether_the_emulator_process_is_up() -> None:
    """What the suite's shared ``emu`` checks before lending the emulator to a module: a
    process killed from outside is not running, and stop() then still succeeds."""
    emulator = Emulator()
    assert not emulator.running
    emulator.start()
    try:
        assert emulator.running
        os.kill(emulator.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while emulator.running and time.monotonic() < deadline:
            time.sleep(0.02)  # until the killed process is gone
        assert not emulator.running
    finally:
        emulator.stop()
    assert not emulator.running
