"""GeoReceiver against the raw azure-servicebus receiver, on the emulator and a real Redis.

Active mode puts two copies of every logical message in the two regions. For the same
copies, one run measures how fast they are drained by:

- raw SDK: one peek-lock receiver per region, ``receive_messages(N)`` then an awaited
  ``complete_message`` per copy (no dedup: the handler would run twice per message);
- GeoReceiver: both regions, Redis seen-set, each logical message handled once.

with 1 receiver process and with ``--processes`` (default 4) receiver processes. It prints
logical messages per second, the ratio GeoReceiver / raw for the same copies (target
>= 0.9), Redis round trips per logical message (target <= 0.06), and the receiver
processes' CPU milliseconds per logical message (all workers, from their start to their
stop: connecting and the idle wait after the drain included). Redis memory per id is
measured by ``benchmarks/redis_memory.py``.

    .venv/bin/python benchmarks/receiver.py [--messages 10000] [--processes 4]
    .venv/bin/python benchmarks/receiver.py --quick   # 500 messages, 1 and 2 processes

It writes its figures to ``benchmarks/results/receiver.json`` (see ``benchmarks/_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from _common import fill_active
from _record import write_record

from georep.adapters.emulator import Emulator

REPO = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFETCH = int(os.environ.get("PREFETCH", "0"))  # the same for both; 0 is either default

_WORKER = """
import asyncio, json, os, signal, sys, time
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

async def raw(stop):
    handled = 0
    async def drain(conn):
        nonlocal handled
        async with ServiceBusClient.from_connection_string(conn) as client, \\
                client.get_queue_receiver(os.environ["QUEUE"],
                                          prefetch_count=int(os.environ["PREFETCH"])) as receiver:
            while not stop.is_set():
                batch = await receiver.receive_messages(max_message_count=50, max_wait_time=0.5)
                for message in batch:
                    handled += 1
                    await receiver.complete_message(message)
    await asyncio.gather(drain(os.environ["PRIMARY"]), drain(os.environ["SECONDARY"]))
    return {"handled": handled}

async def geo(stop):
    handled = 0
    seen = RedisSeenSet(os.environ["REDIS_URL"], group=os.environ["GROUP"], window=600)
    receiver = GeoReceiver.from_connection_strings(
        os.environ["PRIMARY"], os.environ["SECONDARY"], queue_name=os.environ["QUEUE"],
        seen=seen, concurrency=50, max_wait=0.5, prefetch_count=int(os.environ["PREFETCH"]))
    async def handle(message):
        nonlocal handled
        handled += 1
    async def closer():
        await stop.wait()
        await receiver.aclose()
    closing = asyncio.ensure_future(closer())
    await receiver.run(handle)
    await closing
    await seen.aclose()
    return {"handled": handled, "round_trips": seen.round_trips}

if os.environ["KIND"] == "geo":  # imported before READY, as the SDK is for both kinds
    from georep import GeoReceiver
    from georep.adapters.redis import RedisSeenSet

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    cpu = time.process_time()
    result = await (geo(stop) if os.environ["KIND"] == "geo" else raw(stop))
    result["cpu"] = time.process_time() - cpu
    print(json.dumps(result), flush=True)

asyncio.run(main())
"""


def stored(emu: Emulator, queue: str) -> int:
    return sum(emu.namespace(n).message_count(queue) for n in emu.namespaces)


async def until_drained(emu: Emulator, queue: str) -> None:
    """Poll the emulator's counts (another process empties the queues)."""
    while True:
        if not stored(emu, queue):
            return
        await asyncio.sleep(0.05)


async def drain_with(emu: Emulator, queue: str, kind: str, processes: int) -> dict[str, float]:
    """Start ``processes`` workers once the copies are in place; time until none is left."""
    env = {
        **os.environ,
        "KIND": kind,
        "PREFETCH": str(PREFETCH),
        "QUEUE": queue,
        "GROUP": f"bench-{uuid.uuid4().hex[:8]}",
        "REDIS_URL": REDIS_URL,
        "PRIMARY": emu.connection_string("primary"),
        "SECONDARY": emu.connection_string("secondary"),
    }
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WORKER, cwd=REPO, env=env, stdout=subprocess.PIPE
        )
        for _ in range(processes)
    ]
    for worker in workers:
        assert worker.stdout is not None
        await worker.stdout.readline()  # READY: clients are imported; connecting starts now
    started = time.perf_counter()
    await until_drained(emu, queue)
    elapsed = time.perf_counter() - started
    results = []
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 60)
        results.append(json.loads(line))
        await worker.wait()
    return {
        "seconds": elapsed,
        "handled": sum(r["handled"] for r in results),
        "round_trips": sum(r.get("round_trips", 0) for r in results),
        "cpu": sum(r["cpu"] for r in results),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="logical messages")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="500 messages, 1 and 2 processes")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.processes = 500, 2
    ratios: dict[str, float] = {}
    figures: dict[str, dict[str, float]] = {}
    cpu_us: dict[str, float] = {}
    print(
        f"\n{args.messages:,} logical messages, active mode ({2 * args.messages:,} copies),"
        " 200-byte bodies; time from the workers' start to empty queues"
    )
    print(
        f"{'receivers':>9} {'receiver':12} {'seconds':>8} {'logical msg/s':>14} {'x raw':>7}"
        f" {'handler calls':>14} {'Redis trips/msg':>16} {'CPU ms/msg':>11}"
    )
    with Emulator() as emu:
        for processes in (1, args.processes):
            raw_rate = 0.0
            for kind in ("raw", "geo"):
                queue = f"rx-{uuid.uuid4().hex[:6]}"
                for namespace in emu.namespaces:
                    emu.namespace(namespace).create_queue(queue)
                await fill_active(emu, queue, args.messages)
                result = await drain_with(emu, queue, kind, processes)
                rate = args.messages / result["seconds"]
                raw_rate = raw_rate or rate
                trips = result["round_trips"] / args.messages if kind == "geo" else float("nan")
                label = f"{processes} process{'es' if processes > 1 else ''}"
                figures[f"{label}: {kind}"] = {
                    "seconds": round(result["seconds"], 3),
                    "logical_per_s": round(rate),
                    "handled": int(result["handled"]),
                    **({"redis_trips_per_message": round(trips, 3)} if kind == "geo" else {}),
                }
                # The receiver processes' CPU per logical message (the raw receivers read
                # both copies of each, as GeoReceiver does).
                cpu_us[f"{label}: {'GeoReceiver' if kind == 'geo' else 'raw SDK'}"] = round(
                    1e6 * result["cpu"] / args.messages, 1
                )
                if kind == "geo":
                    ratios[f"{label}: GeoReceiver"] = rate / raw_rate
                print(
                    f"{processes:>9} {'GeoReceiver' if kind == 'geo' else 'raw SDK':12}"
                    f" {result['seconds']:8.2f} {rate:14,.0f} {rate / raw_rate:7.2f}"
                    f" {int(result['handled']):14,} {trips:16.3f}"
                    f" {1000 * result['cpu'] / args.messages:11.3f}"
                )
    # The receivers are child processes with their own CPU and memory, not counted here.
    write_record(
        "receiver", quick=args.quick, ratios=ratios, cpu_per_message_us=cpu_us, figures=figures
    )


if __name__ == "__main__":
    asyncio.run(main())
