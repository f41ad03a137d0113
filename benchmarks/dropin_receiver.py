"""Pull receive + complete: the drop-in client against the raw SDK's receivers, same copies.

Active mode puts two copies of every logical message in the two regions. For the same
copies, one run measures how fast a program that pulls (``receive_messages(50)``, then an
awaited ``complete_message`` per message) drains them with:

- raw SDK, one namespace: the program before its client line changed, one receiver on one
  namespace holding one copy of each message (the same loop, the baseline a user sees);
- raw SDK: one ``azure.servicebus.aio`` receiver per region, run side by side (each copy is
  handed to the program: twice per logical message);
- drop-in: ``georep.servicebus.aio.ServiceBusClient`` over both regions and a Redis
  seen-set (each logical message handed out once; the twin settled by georep).

It prints logical messages per second and the ratios drop-in / raw (issue 27's target:
>= 0.9), timing from the first receive to both regions empty. Each program stops
receiving once it has handled the messages it was sent (see :func:`pull`).

    .venv/bin/python benchmarks/dropin_receiver.py [--messages 5000]
    .venv/bin/python benchmarks/dropin_receiver.py --quick   # 1,500 messages
    .venv/bin/python benchmarks/dropin_receiver.py --loop iterate   # async for

The quick form (the regression check's) takes 1,500: with 500 the one-namespace run
lasted a quarter of a second, and its ratio moved by more than its five-run band between
two checks of the same commit.

It writes its figures to ``benchmarks/results/dropin_receiver.json`` (``benchmarks/_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

from _common import BODY, fill_active
from _record import write_record
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as SdkClient

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def stored(emu: Emulator, queue: str) -> int:
    return sum(emu.namespace(n).message_count(queue) for n in emu.namespaces)


async def fill_one(emu: Emulator, queue: str, count: int) -> None:
    """``count`` messages in the primary only (the one-namespace program's queue)."""
    async with (
        SdkClient.from_connection_string(emu.connection_string("primary")) as east,
        east.get_queue_sender(queue) as sender,
    ):
        for start in range(0, count, 100):
            await sender.send_messages(
                [ServiceBusMessage(BODY) for _ in range(min(100, count - start))]
            )


LOOP = "batch"
"""How the program pulls (``--loop``): ``batch`` (``receive_messages(50)``) or ``iterate``
(``async for``, the receiver's ``max_wait_time`` ending it)."""
COUNT = 5_000
"""Messages each program receives (``--messages``): each region's copies for a raw
receiver, the logical messages for the drop-in."""
DRAIN_SECONDS = 30.0
"""Seconds the regions may take to empty once the program handled every message."""


async def pull(receiver: Any, expected: int) -> int:
    """Receive and complete until ``expected`` messages were handled; the messages handled.

    The program stops once it has what it was sent, as one that knows its workload does.
    It does not ask the regions' counts between receives (blocking HTTP on the event loop,
    paid once per loop), and does not make a last call that waits out ``max_wait_time``
    while georep settles the twins in the background: :func:`drained` waits for those."""
    handled = 0
    while handled < expected:
        if LOOP == "iterate":
            async for message in receiver:
                handled += 1
                await receiver.complete_message(message)
                if handled >= expected:
                    break
            continue
        for message in await receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
            handled += 1
            await receiver.complete_message(message)
    return handled


async def drained(emu: Emulator, queue: str) -> None:
    """Wait until no region stores a copy (twins are settled in the background).

    Raises:
        TimeoutError: A copy stayed for ``DRAIN_SECONDS`` (the run left something behind).
    """
    # The counts live in the emulator's process: there is no event to wait on, only them.
    async with asyncio.timeout(DRAIN_SECONDS):
        while stored(emu, queue):  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def one_namespace(emu: Emulator, queue: str) -> tuple[float, int]:
    async with (
        SdkClient.from_connection_string(emu.connection_string("primary")) as east,
        east.get_queue_receiver(queue, max_wait_time=0.5) as receiver,
    ):
        started = time.perf_counter()
        handled = await pull(receiver, COUNT)
        await drained(emu, queue)
        return time.perf_counter() - started, handled


async def raw(emu: Emulator, queue: str) -> tuple[float, int]:
    async with (
        SdkClient.from_connection_string(emu.connection_string("primary")) as east,
        SdkClient.from_connection_string(emu.connection_string("secondary")) as west,
        east.get_queue_receiver(queue, max_wait_time=0.5) as first,
        west.get_queue_receiver(queue, max_wait_time=0.5) as second,
    ):
        started = time.perf_counter()
        handled = await asyncio.gather(pull(first, COUNT), pull(second, COUNT))
        await drained(emu, queue)
        return time.perf_counter() - started, sum(handled)


async def dropin(emu: Emulator, queue: str) -> tuple[float, int]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    async with RedisSeenSet.from_url(REDIS_URL, group=group, window=600) as seen:
        client = ServiceBusClient.from_connection_strings(
            emu.connection_string("primary"),
            emu.connection_string("secondary"),
            seen=seen,
            mode=ReplicationMode.ACTIVE,
        )
        async with client, client.get_queue_receiver(queue, max_wait_time=0.5) as receiver:
            started = time.perf_counter()
            handled = await pull(receiver, COUNT)
            await drained(emu, queue)
            return time.perf_counter() - started, handled


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5_000, help="logical messages")
    parser.add_argument("--quick", action="store_true", help="1,500 logical messages")
    parser.add_argument(
        "--loop",
        choices=("batch", "iterate"),
        default="batch",
        help="receive_messages(50) per call (default), or async for, one message at a time",
    )
    args = parser.parse_args()
    global LOOP, COUNT
    LOOP = args.loop
    if args.quick:
        args.messages = 1_500
    COUNT = args.messages
    figures: dict[str, dict[str, float]] = {}
    cpu_us: dict[str, float] = {}
    print(
        f"\n{args.messages:,} logical messages, active mode ({2 * args.messages:,} copies), "
        f"{args.loop} loop"
    )
    print(f"{'receiver':13} {'seconds':>8} {'logical msg/s':>14} {'x raw':>7} {'handled':>8}")
    with Emulator() as emu:
        raw_rate = 0.0
        runs = (("one namespace", one_namespace), ("raw SDK", raw), ("drop-in", dropin))
        for name, run in runs:
            queue = f"dx-{uuid.uuid4().hex[:6]}"
            for namespace in emu.namespaces:
                emu.namespace(namespace).create_queue(queue)
            if run is one_namespace:
                await fill_one(emu, queue, args.messages)
            else:
                await fill_active(emu, queue, args.messages)
            cpu_started = time.process_time()
            seconds, handled = await run(emu, queue)
            cpu_us[name] = (time.process_time() - cpu_started) / args.messages * 1e6
            rate = args.messages / seconds
            raw_rate = rate if name == "raw SDK" else raw_rate
            figures[name] = {"seconds": round(seconds, 3), "logical_per_s": round(rate)}
            ratio = f"{rate / raw_rate:7.2f}" if raw_rate else f"{'':7}"
            print(f"{name:13} {seconds:8.2f} {rate:14,.0f} {ratio} {handled:8,}")
    # CPU: this process's, the emulator (a child process) excluded, per logical message.
    write_record(
        "dropin_receiver" if args.loop == "batch" else "dropin_receiver_iterate",
        quick=args.quick,
        ratios={
            "drop-in receiver": figures["drop-in"]["logical_per_s"] / raw_rate,
            "drop-in vs one namespace": figures["drop-in"]["logical_per_s"]
            / figures["one namespace"]["logical_per_s"],
            "cpu drop-in receiver": cpu_us["raw SDK"] / cpu_us["drop-in"],
        },
        cpu_per_message_us=cpu_us,
        figures=figures,
    )


if __name__ == "__main__":
    asyncio.run(main())
