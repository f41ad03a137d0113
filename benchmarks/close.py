"""How long closing takes: GeoSender and GeoReceiver against the raw SDK, on the emulator.

A GeoSender or GeoReceiver built with ``from_connection_strings`` owns one SDK client and
sender (or receiver) per region and closes them in ``aclose()``. The raw baseline is what
an application closing the same SDK objects itself pays: one region's client and sender
(or receiver), opened, used once, closed. georep closes its two regions concurrently,
bounded by a close timeout, so its close should cost about one region's, not two.

    .venv/bin/python benchmarks/close.py [--runs 7]

Prints the median and max seconds per variant and the ratio georep / raw (same run).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from _common import on_emulator
from _record import write_record
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from georep import GeoReceiver, GeoSender
from georep.adapters.emulator import Emulator
from georep.testing import InMemorySeenSet


async def timed_close(client: ServiceBusClient, handler: Any) -> float:
    """Seconds to close an SDK sender or receiver, then its client (the raw baseline)."""
    started = time.perf_counter()
    await handler.close()
    await client.close()
    return time.perf_counter() - started


async def raw_sender(emu: Emulator, queue: str) -> float:
    client = ServiceBusClient.from_connection_string(emu.connection_string("primary"))
    sender = client.get_queue_sender(queue)
    await sender.send_messages(ServiceBusMessage("x"))
    return await timed_close(client, sender)


async def geo_sender(emu: Emulator, queue: str) -> float:
    sender = on_emulator(GeoSender, emu, queue)
    async with sender:
        await sender.send_messages(ServiceBusMessage("x"))
        started = time.perf_counter()
    return time.perf_counter() - started


async def raw_receiver(emu: Emulator, queue: str) -> float:
    client = ServiceBusClient.from_connection_string(emu.connection_string("primary"))
    receiver = client.get_queue_receiver(queue)
    await receiver.__aenter__()  # opens the link, as `async with receiver` does
    await receiver.receive_messages(max_message_count=1, max_wait_time=0.2)
    return await timed_close(client, receiver)


async def geo_receiver(emu: Emulator, queue: str) -> float:
    receiver = on_emulator(GeoReceiver, emu, queue, seen=InMemorySeenSet(), max_wait=0.2)
    running = asyncio.create_task(receiver.run(lambda message: asyncio.sleep(0)))
    await asyncio.sleep(1.0)  # both regions' links are open and receiving
    started = time.perf_counter()
    await receiver.aclose()
    elapsed = time.perf_counter() - started
    await running
    return elapsed


async def measure(
    emu: Emulator, queue: str, variant: Callable[[Emulator, str], Awaitable[float]], runs: int
) -> list[float]:
    return [await variant(emu, queue) for _ in range(runs)]


async def main(runs: int) -> None:
    ratios: dict[str, float] = {}
    figures: dict[str, dict[str, float]] = {}
    queue = f"close-{uuid.uuid4().hex[:6]}"
    with Emulator(queues=(queue,)) as emu:
        print(f"close time, seconds ({runs} runs each, emulator on loopback)")
        print(f"{'variant':<14} {'median':>8} {'max':>8}   ratio georep / raw (median)")
        for kind, raw, geo in (
            ("sender", raw_sender, geo_sender),
            ("receiver", raw_receiver, geo_receiver),
        ):
            # Alternate the order between kinds so neither always runs on a warm machine.
            raw_times = await measure(emu, queue, raw, runs)
            geo_times = await measure(emu, queue, geo, runs)
            raw_median, geo_median = statistics.median(raw_times), statistics.median(geo_times)
            print(f"{'raw ' + kind:<14} {raw_median:8.3f} {max(raw_times):8.3f}")
            print(
                f"{'Geo' + kind.capitalize():<14} {geo_median:8.3f} {max(geo_times):8.3f}"
                f"   {geo_median / raw_median:.2f}x (two regions, closed concurrently)"
            )
            # raw / georep close time: higher is better, as every recorded ratio
            ratios[f"Geo{kind} close"] = raw_median / geo_median
            figures[kind] = {
                "raw_median_s": round(raw_median, 4),
                "geo_median_s": round(geo_median, 4),
                "raw_max_s": round(max(raw_times), 4),
                "geo_max_s": round(max(geo_times), 4),
            }
    write_record("close", quick=False, ratios=ratios, figures={"runs": runs, **figures})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    asyncio.run(main(parser.parse_args().runs))
