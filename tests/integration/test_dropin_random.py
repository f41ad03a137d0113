"""Seeded random programs on the drop-in client, the real SDK and a real Redis: what no
scripted test orders. A program sends through the client in active mode while it pulls,
cancels its own receive calls at random moments, completes or abandons what it gets, closes
its receiver mid-stream and opens another, and meets a primary outage at a random moment.
Whatever the seed, each message is completed once and neither region keeps a copy.

A failing seed replays the same schedule: ``pytest -k 'random and SEED'``."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest
from _helpers import eventually, fault, stored
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

pytestmark = pytest.mark.integration

LOCK_SECONDS = 5
"""Lock duration of the queue: a copy an outage leaves locked comes back soon."""
MESSAGES = 40


@pytest.mark.parametrize("seed", [3, 17, 2026])
async def test_a_random_program_completes_each_message_once_and_leaves_nothing(
    emu: Emulator, private_queue: Any, seen: RedisSeenSet, seed: int
) -> None:
    rng = random.Random(seed)
    queue = private_queue("random", lock_duration=LOCK_SECONDS)
    bodies = [f"r{seed}-{i}" for i in range(MESSAGES)]
    completed: Counter[str] = Counter()
    cancels: Counter[str] = Counter()
    outage_at = rng.randint(5, MESSAGES - 5)  # after this many sends, for 2 s
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

    async with client:
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
    assert await eventually(lambda: stored(emu, queue) == 0, within=30), (
        f"seed {seed}: a copy was left: {stored(emu, queue)}"
    )
