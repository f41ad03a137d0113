"""Seeded random programs on the drop-in client, the real SDK and a real Redis: what no
scripted test orders. A program sends through the client in active mode while it pulls,
cancels its own receive calls at random moments, completes or abandons what it gets, closes
its receiver mid-stream and opens another, and meets a primary outage at a random moment;
a threaded program does the same with the blocking client. Whatever the seed, each message
is completed once, and what a program leaves behind is only twins of what it completed
(copies an outage kept it from settling): the next receiver hands none of them out and
settles them all.

A failing seed replays the same schedule: ``pytest -k 'random and SEED'``."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from _helpers import REDIS_URL, eventually, fault, stored
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus import ServiceBusClient as SyncClient
from georep.servicebus.aio import ServiceBusClient

pytestmark = pytest.mark.integration

LOCK_SECONDS = 5
"""Lock duration of the queue: a copy an outage leaves locked comes back soon."""
MESSAGES = 40


@pytest.mark.parametrize("seed", [3, 17, 2026])
async def test_a_random_program_completes_each_message_once_and_leaves_nothing(
    emu: Emulator, private_queue: Any, seed: int
) -> None:
    rng = random.Random(seed)
    queue = private_queue("random", lock_duration=LOCK_SECONDS)
    bodies = [f"r{seed}-{i}" for i in range(MESSAGES)]
    completed: Counter[str] = Counter()
    cancels: Counter[str] = Counter()
    outage_at = rng.randint(5, MESSAGES - 5)  # after this many sends, for 2 s
    group = f"test-{uuid.uuid4().hex[:8]}"
    seen = RedisSeenSet.from_url(REDIS_URL, group=group, window=600)
    client = ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        seen=seen,
        mode=ReplicationMode.ACTIVE,
    )

    async def send_all() -> None:
        async with client.get_queue_sender(queue) as sender:
            for index, body in enumerate(bodies):
                if index == outage_at:
                    await fault(emu, "primary", "outage")
                    asyncio.get_running_loop().call_later(
                        2, lambda: asyncio.ensure_future(fault(emu, "primary", "restore"))
                    )
                while True:  # an application's retry of a send that failed
                    try:
                        await sender.send_messages(ServiceBusMessage(body))
                        break
                    except ServiceBusError:
                        await asyncio.sleep(0.2)
                await asyncio.sleep(rng.choice([0, 0, 0.01, 0.05]))

    async def pull_a_while(receiver: Any, calls: int) -> None:
        for _ in range(calls):
            call = asyncio.ensure_future(
                receiver.receive_messages(rng.randint(1, 8), max_wait_time=rng.choice([0.3, 1]))
            )
            # Cancelled at a random moment of the call (until one is, every call).
            if rng.random() < 0.25 or not cancels["asked"]:
                await asyncio.sleep(rng.choice([0, 0.01, 0.1, 0.3]))
                cancels["asked"] += call.cancel()
            try:
                got = await call
            except asyncio.CancelledError:
                cancels["raised"] += 1
            else:
                for message in got:
                    if rng.random() < 0.15:
                        await receiver.abandon_message(message)
                    else:
                        await receiver.complete_message(message)
                        completed[str(message)] += 1

    async with seen, client:
        sending = asyncio.ensure_future(send_all())
        deadline = time.monotonic() + 150
        while not sending.done() or sum(completed.values()) < MESSAGES:
            assert time.monotonic() < deadline, f"seed {seed}: only {sorted(completed)} came"
            # A receiver for a while, then closed (its messages handed back) mid-stream.
            async with client.get_queue_receiver(queue) as receiver:
                await pull_a_while(receiver, rng.randint(1, 6))
            assert len(completed) <= MESSAGES
            if sending.done():
                sending.result()  # a send that failed for good fails the test here
            if sum(completed.values()) >= MESSAGES and sending.done():
                break
        await sending

    assert completed == Counter(bodies), f"seed {seed}: each message completed once"
    assert cancels["raised"] == cancels["asked"] > 0, "receive calls were cancelled mid-call"
    await _nothing_comes_again(emu, queue, group)


@pytest.mark.parametrize("seed", [5, 11])
def test_a_random_threaded_sync_program_completes_each_message_once(
    emu: Emulator, private_queue: Any, seed: int
) -> None:
    """The blocking client as threaded programs use it: one thread sends (a 2 s primary
    outage at a random send), two threads receive, each through receivers it opens and
    closes again at random, completing or abandoning what it gets."""
    queue = private_queue("random-sync", lock_duration=LOCK_SECONDS)
    bodies = [f"s{seed}-{i}" for i in range(MESSAGES)]
    outage_at = random.Random(seed).randint(5, MESSAGES - 5)
    completed: Counter[str] = Counter()
    counting = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []
    group = f"test-{uuid.uuid4().hex[:8]}"
    client = SyncClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        seen=RedisSeenSet(REDIS_URL, group=group, window=600),
        mode=ReplicationMode.ACTIVE,
    )

    def send_all() -> None:
        rng = random.Random(seed)
        with client.get_queue_sender(queue) as sender:
            for index, body in enumerate(bodies):
                if index == outage_at:
                    emu.namespace("primary").outage()
                    threading.Timer(2, emu.namespace("primary").restore).start()
                while True:
                    try:
                        sender.send_messages(ServiceBusMessage(body))
                        break
                    except ServiceBusError:
                        time.sleep(0.2)
                time.sleep(rng.choice([0, 0, 0.01, 0.05]))

    def receive_all(worker: int) -> None:
        rng = random.Random(seed * 100 + worker)
        while not done.is_set():
            with client.get_queue_receiver(queue) as receiver:
                for _ in range(rng.randint(1, 6)):
                    wait = rng.choice([0.3, 1])
                    for message in receiver.receive_messages(rng.randint(1, 8), max_wait_time=wait):
                        if rng.random() < 0.15:
                            receiver.abandon_message(message)
                            continue
                        receiver.complete_message(message)
                        with counting:
                            completed[str(message)] += 1
                            if sum(completed.values()) >= MESSAGES:
                                done.set()

    def guarded(target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)
            done.set()

    with client:
        threads = [threading.Thread(target=guarded, args=(send_all,))]
        threads += [threading.Thread(target=guarded, args=(receive_all, w)) for w in (1, 2)]
        for thread in threads:
            thread.start()
        done.wait(150)
        done.set()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a thread did not stop"

    assert not errors, f"seed {seed}: {errors!r}"
    assert completed == Counter(bodies), f"seed {seed}: each message completed once"
    asyncio.run(_nothing_comes_again(emu, queue, group))


async def _nothing_comes_again(emu: Emulator, queue: str, group: str) -> None:
    """What a program left behind is only twins of what it completed (copies whose
    settlement an outage cut short, or that no receiver was open to sweep when it stopped):
    the next receiver on the seen-set, once their locks have run out, hands none of them out
    and settles them all, so that neither region keeps a copy."""
    await asyncio.sleep(LOCK_SECONDS + 1)
    async with RedisSeenSet.from_url(REDIS_URL, group=group, window=600) as seen:
        client = ServiceBusClient.from_connection_strings(
            emu.connection_string("primary"), emu.connection_string("secondary"), seen=seen
        )
        async with client, client.get_queue_receiver(queue) as receiver:
            again = await receiver.receive_messages(10, max_wait_time=3)
            assert again == [], f"handed out again: {[str(m) for m in again]}"
            assert await eventually(lambda: stored(emu, queue) == 0, within=30), (
                f"a copy was left: {stored(emu, queue)}"
            )
